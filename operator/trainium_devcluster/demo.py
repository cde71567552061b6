"""`trainium-operator dev demo`: the whole product on one machine, in about two minutes.

1. a local control plane with two fake trn1.32xlarge nodes (`dev up`);
2. the chart's CRDs, ServiceAccount and RBAC (rendered with the real helm binary);
3. the operator as a process, authenticated as the chart's ServiceAccount (token kubeconfig),
   so it has exactly the chart's permissions;
4. the tutorial's TrainingJob (`examples/bert-large-pretrain.yaml`) applied with kubectl;
5. KWOK pods stand in for the containers; in their place the demo runs each pod's own torchrun
   command on this machine's CPU at demo size (tiny BERT, one rank per pod, generated shards),
   with `/data` mapped to a local folder and the pod's pod-bound health token (requested as the
   kubelet would): the compile stage in graph-extraction mode, then training with the profiler
   on. Each process's exit code becomes its pod's exit code. The ranks report to the operator's
   health channel, so STEP, RATE, ETA and GOODPUT fill in while the job trains;
6. `kubectl get trainingjobs` printed at every transition and as the step advances, then the
   profile report and where to look next (the UI's live job list among it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainium_devcluster import build, cluster, local_preflight, paths, sim
from trainium_devcluster.access import service_account_kubeconfig
from trainium_devcluster.clients import Clients, clients_for, wait_established
from trainium_operator.builders.job import (
    VOLCANO_GROUP,
    VOLCANO_GROUP_ANNOTATION,
    VOLCANO_VERSION,
)
from trainium_operator.contract import channel, workload_env

Echo = Callable[[str], None]
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "bert-large-pretrain.yaml"
CHART = REPO / "charts" / "trainium-operator"
OPERATOR_NAMESPACE = "trainium-system"
RELEASE = "trainium-operator"
JOB_NAMESPACE = "default"  # where the dev cluster's fsx-claim lives
SHARED_MOUNT = "/data"
GROUP, VERSION, PLURAL = "trainium.dev", "v1alpha1", "trainingjobs"
# Appended after the job's own script arguments (argparse keeps the last value), so the
# local CPU run is small while every flag the operator added is still the operator's.
DEMO_STEPS = 300
DEMO_SIZE_ARGS = (
    "--model_config", "tiny", "--batch_size", "4", "--grad_accum_usteps", "1",
    "--max_steps", str(DEMO_STEPS), "--warmup_steps", "0", "--log_every_steps", "50",
)  # fmt: skip
# The demo's size in the job itself (printed when it is applied): one rank per pod, as the
# local run has; reports every second and a status write every two, so a run of seconds
# shows its progress; the ETA against the demo's step count.
DEMO_JOB_SIZE: dict[str, Any] = {
    "processesPerNode": 1,
    "health": {"reportIntervalSeconds": 1, "totalSteps": DEMO_STEPS},
}
DEMO_PROGRESS_INTERVAL_S = "2"
DEMO_PROFILE_STEPS = "10:14"
TERMINAL = ("Succeeded", "Failed")
# What of the pod's torchrun arguments a local run keeps: the shape of the gang. The rendezvous
# is local and static (--node_rank, --master_addr/--master_port) instead.
LOCAL_LAUNCHER_FLAGS = ("--nnodes", "--nproc_per_node", "--max_restarts")


class DemoError(RuntimeError):
    """The demo could not continue; the message says what and where to look."""


def _require_checkout() -> None:
    for needed in (EXAMPLE, CHART, REPO / "images" / "training" / "trainium_training"):
        if not needed.exists():
            raise DemoError(f"{needed} not found: run the demo from a trainium-operator checkout")


def _run(args: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None) -> str:
    result = subprocess.run(args, input=stdin, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise DemoError(f"{' '.join(args[:4])} ... failed:\n{result.stderr or result.stdout}")
    return result.stdout


@dataclass
class LocalRun:
    """The pods' workload, run on this machine: one torchrun per pod of one gang."""

    stage: str
    processes: dict[str, subprocess.Popen[bytes]]  # by pod name
    logs: dict[str, Path]  # by pod name

    def ended(self) -> bool:
        """All ended; or one failed, and the rest are stopped (their gang is broken)."""
        codes = [process.poll() for process in self.processes.values()]
        if any(code not in (None, 0) for code in codes):
            for process in self.processes.values():
                if process.poll() is None:
                    process.terminate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(timeout=10)
            return all(p.poll() is not None for p in self.processes.values())
        return all(code is not None for code in codes)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()


@dataclass
class Demo:
    name: str
    echo: Echo
    workdir: Path = field(init=False)
    shared: Path = field(init=False)
    clients: Clients | None = None
    kubeconfig: Path | None = None
    toolchain: build.Toolchain | None = None
    operator: subprocess.Popen[bytes] | None = None
    local: LocalRun | None = None
    driven: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.workdir = paths.cache_root() / "demo" / self.name
        self.shared = self.workdir / "fsx"

    # -- set-up ----------------------------------------------------------------------------
    def tool_env(self) -> dict[str, str]:
        assert self.toolchain is not None
        assert self.kubeconfig is not None
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = os.pathsep.join([*map(str, self.toolchain.bin_dirs), env.get("PATH", "")])
        return env

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return _run(["kubectl", *args], env=self.tool_env(), stdin=stdin)

    def start_cluster(self) -> None:
        build.build_all(jobs=build.default_jobs(), echo=self.echo)
        self.toolchain = build.require_toolchain()
        report = cluster.up(
            self.name, nodes=2, instance_type="trn1.32xlarge", neuron_taint=False, echo=self.echo
        )
        self.kubeconfig = report.kubeconfig
        self.clients = clients_for(report.kubeconfig)

    def install_chart_access(self) -> Path:
        """CRDs, then the chart's ServiceAccount and RBAC; returns the operator's kubeconfig."""
        self.echo("installing the chart's CRDs, ServiceAccount and RBAC (helm template | kubectl)")
        self.kubectl("apply", "--server-side", "-f", str(CHART / "crds"))
        assert self.clients is not None
        wait_established(self.clients, "trainingjobs.trainium.dev")
        manifests = _run(
            [
                "helm",
                "template",
                RELEASE,
                str(CHART),
                "--namespace",
                OPERATOR_NAMESPACE,
                "--show-only",
                "templates/serviceaccount.yaml",
                "--show-only",
                "templates/rbac.yaml",
            ],
            env=self.tool_env(),
        )
        self.kubectl("apply", "-f", "-", stdin=_namespace_manifest(OPERATOR_NAMESPACE))
        self.kubectl("apply", "-n", OPERATOR_NAMESPACE, "-f", "-", stdin=manifests)
        account = _service_account_name(manifests)
        assert self.clients is not None
        assert self.kubeconfig is not None
        return service_account_kubeconfig(
            self.clients,
            self.kubeconfig,
            namespace=OPERATOR_NAMESPACE,
            service_account=account,
            output=self.workdir / "operator-kubeconfig.yaml",
        )

    def start_operator(self, kubeconfig: Path) -> Path:
        log = self.workdir / "operator.log"
        self.echo(f"starting the operator as system:serviceaccount:{OPERATOR_NAMESPACE}:... "
                  f"(log: {log})")  # fmt: skip
        handle = log.open("wb")
        # The health channel on a local port: the pods' env names http://127.0.0.1:<port>/...,
        # which the local ranks reach as they are.
        port = local_preflight.free_port()
        self.echo(f"  health channel on port {port}; progress written every "
                  f"{DEMO_PROGRESS_INTERVAL_S} s (the chart's default: 10 s)")  # fmt: skip
        self.operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainium_operator",
                "run",
                "--kubeconfig",
                str(kubeconfig),
                "--health-port",
                str(port),
                "--progress-interval",
                DEMO_PROGRESS_INTERVAL_S,
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
        return log

    def make_data(self) -> Path:
        data = self.shared / "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128"
        if not any(data.glob("*.hdf5")):
            self.echo(f"generating synthetic HDF5 shards in the tutorial's format: {data}")
            _run(
                [
                    sys.executable,
                    str(_training_script("make_shards.py")),
                    "--output_dir",
                    str(data),
                    "--num_shards",
                    "4",
                    "--vocab_size",
                    "1024",  # the tiny model's vocabulary
                    "--samples_per_shard",
                    "256",
                ],
                env=_training_env(),
            )
        return data

    # -- the job -----------------------------------------------------------------------------
    def apply_job(self) -> str:
        manifest = yaml.safe_load(EXAMPLE.read_text())
        name: str = manifest["metadata"]["name"]
        assert self.clients is not None
        try:
            self.clients.custom.delete_namespaced_custom_object(
                GROUP, VERSION, JOB_NAMESPACE, PLURAL, name
            )
            sim.wait_for(
                lambda: self._job(name) is None,
                timeout=60,
                description=f"the previous demo's {name} deleted",
            )
        except Exception as error:
            if getattr(error, "status", None) != 404:
                raise
        shutil.rmtree(self.shared / "output", ignore_errors=True)
        shutil.rmtree(self.shared / "profiles", ignore_errors=True)
        for key, value in DEMO_JOB_SIZE.items():
            manifest["spec"][key] = (
                {**manifest["spec"].get(key, {}), **value} if isinstance(value, dict) else value
            )
        self.echo(f"$ kubectl apply -f {EXAMPLE.relative_to(REPO)}   # at demo size: "
                  f"{_flat(DEMO_JOB_SIZE)}")  # fmt: skip
        applied = self.kubectl(
            "apply", "-n", JOB_NAMESPACE, "-f", "-", stdin=yaml.safe_dump(manifest)
        )
        self.echo(applied.strip())
        return name

    def _job(self, name: str) -> dict[str, Any] | None:
        assert self.clients is not None
        try:
            job: dict[str, Any] = self.clients.custom.get_namespaced_custom_object(
                GROUP, VERSION, JOB_NAMESPACE, PLURAL, name
            )
        except Exception as error:
            if getattr(error, "status", None) == 404:
                return None
            raise
        return job

    def _running_gang(self, name: str, nodes: int) -> list[Any]:
        """The newest gang of the job when all its pods run and none is driven yet."""
        assert self.clients is not None
        pods = self.clients.core.list_namespaced_pod(
            JOB_NAMESPACE, label_selector=f"trainium.dev/job-name={name}"
        ).items
        gangs: dict[tuple[int, str], list[Any]] = {}
        for pod in pods:
            labels = pod.metadata.labels
            key = (int(labels["trainium.dev/attempt"]), labels["trainium.dev/stage"])
            gangs.setdefault(key, []).append(pod)
        for key in sorted(gangs, key=lambda k: (k[0], k[1] == "train"), reverse=True):
            gang = sorted(
                gangs[key], key=lambda p: int(p.metadata.labels["trainium.dev/node-rank"])
            )
            if (
                len(gang) == nodes
                and all(p.status.phase == "Running" for p in gang)
                and not any(p.metadata.name in self.driven for p in gang)
            ):
                return gang
        return []

    def start_local_run(self, gang: list[Any]) -> None:
        """Runs each pod's torchrun command here, one process per pod, meeting through a local
        static rendezvous (the pod's own node rank; its etcd endpoint does not resolve here)."""
        assert self.clients is not None
        stage = gang[0].metadata.labels["trainium.dev/stage"]
        port = local_preflight.free_port()
        logs = {pod.metadata.name: self.workdir / f"{pod.metadata.name}.log" for pod in gang}
        self.echo(
            f"  pods {', '.join(p.metadata.name for p in gang)} are Running on "
            f"{', '.join(p.spec.node_name for p in gang)}; running their {stage} commands locally "
            f"on CPU at demo size (logs: {', '.join(log.name for log in logs.values())} "
            f"in {self.workdir})"
        )
        # The gang's PodGroups as Volcano's scheduler and controller manager wrote them. Volcano
        # writes a group's Running phase in the scheduling cycle after its pods were bound.
        self.wait_podgroup_running(gang[0])
        self.echo("$ kubectl get podgroups")
        self.echo(
            self.kubectl(
                "get", "podgroups", "-n", JOB_NAMESPACE, "-o",
                "custom-columns=NAME:.metadata.name,PHASE:.status.phase,MINMEMBER:.spec.minMember,"
                "SUCCEEDED:.status.succeeded,QUEUE:.spec.queue,"
                "WRITTEN-BY:.metadata.managedFields[*].manager",
            ).rstrip()
        )  # fmt: skip
        processes = {}
        for pod in gang:
            argv, env = self.local_command(pod, stage, port)
            processes[pod.metadata.name] = subprocess.Popen(
                argv, env=env, stdout=logs[pod.metadata.name].open("wb"), stderr=subprocess.STDOUT
            )
        self.local = LocalRun(stage, processes, logs)
        self.driven.update(processes)

    def local_command(self, pod: Any, stage: str, port: int) -> tuple[list[str], dict[str, str]]:
        """The pod's torchrun command and env for a process on this machine."""
        assert self.clients is not None
        container = pod.spec.containers[0]
        command = [_local_path(a, self.shared) for a in container.command]
        script_at = next(i for i, a in enumerate(command) if a.endswith("pretrain.py"))
        launcher = [a for a in command[1:script_at] if a.split("=", 1)[0] in LOCAL_LAUNCHER_FLAGS]
        env = _training_env()
        for var in container.env or []:
            if var.value is not None:
                env[var.name] = _local_path(var.value, self.shared)
        env[workload_env.NODE_NAME] = pod.spec.node_name
        env["TRAINIUM_PRECISION"] = "fp32"  # bf16 is the Neuron path; CPU trains in fp32
        if channel.URL in env:
            # The pod's projected token and its own /dev/shm folder, here: the kubelet's part.
            own = self.workdir / "pods" / pod.metadata.name
            own.mkdir(parents=True, exist_ok=True)
            token = own / channel.TOKEN_NAME
            token.write_text(sim.pod_token(self.clients.core, pod, channel.AUDIENCE))
            env[channel.TOKEN_FILE] = str(token)
            env[channel.POD_DIR] = str(own / "shm")
        if stage == "compile":
            # What neuron_parallel_compile does around the command: graph extraction only.
            env["NEURON_EXTRACT_GRAPHS_ONLY"] = "1"
        else:
            env["TRAINIUM_PROFILE_STEPS"] = DEMO_PROFILE_STEPS
        argv = [
            sys.executable, "-m", "torch.distributed.run", *launcher,
            f"--node_rank={pod.metadata.labels['trainium.dev/node-rank']}",
            "--master_addr=127.0.0.1", f"--master_port={port}",
            str(_training_script("pretrain.py")), *command[script_at + 1 :], *DEMO_SIZE_ARGS,
        ]  # fmt: skip
        return argv, env

    def preflight_passed(self, gang: list[Any]) -> bool:
        """Runs the gang's preflight here first when its pods have one (spec.preflight): True
        when it passed (or there is none); else the pods ended as the check did."""
        assert self.clients is not None
        runs = local_preflight.start(gang, self.workdir, _training_env())
        if not runs:
            return True
        self.echo(f"  preflight of {', '.join(r.pod for r in runs)}: one process per node")
        codes = local_preflight.finish(runs, self.clients.core, JOB_NAMESPACE, timeout=120)
        if all(code == 0 for code in codes.values()):
            return True
        self.echo(f"  preflight failed (exit codes {sorted(set(codes.values()))}); see "
                  f"{runs[0].log.parent}")  # fmt: skip
        self.driven.update(codes)
        return False

    def wait_podgroup_running(self, pod: Any, timeout: float = 15) -> None:
        """Waits (bounded: the demo goes on either way) until Volcano says the pod's gang runs."""
        assert self.clients is not None
        group = (pod.metadata.annotations or {}).get(VOLCANO_GROUP_ANNOTATION)
        if group is None:
            return
        read = functools.partial(
            self.clients.custom.get_namespaced_custom_object,
            VOLCANO_GROUP, VOLCANO_VERSION, JOB_NAMESPACE, "podgroups", group,
        )  # fmt: skip
        with contextlib.suppress(sim.WaitTimeoutError):
            sim.wait_for(
                read,
                until=lambda found: found.get("status", {}).get("phase") != "Inqueue",
                timeout=timeout,
                description=f"PodGroup {group} past Inqueue",
            )

    def finish_local_run(self) -> None:
        run = self.local
        if run is None or not run.ended():
            return
        assert self.clients is not None
        codes = {pod: process.returncode for pod, process in run.processes.items()}
        self.echo(f"  local {run.stage} runs exited {sorted(set(codes.values()))}; ending "
                  "each pod the same way")  # fmt: skip
        for pod, code in codes.items():
            sim.simulate_pod_outcome(
                self.clients.core,
                JOB_NAMESPACE,
                pod,
                succeeded=code == 0,
                exit_code=code if code else None,
                message=None if code == 0 else f"see {run.logs[pod]}",
            )
        self.local = None

    def watch(self, name: str, nodes: int, timeout: float = 900) -> dict[str, Any]:
        self.echo("$ kubectl get trainingjobs -w")
        self.echo(self.kubectl("get", "trainingjobs", "-n", JOB_NAMESPACE, "-o", "wide").rstrip())
        last: tuple[Any, ...] = ()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.assert_operator_alive()
            job = self._job(name) or {}
            status = job.get("status") or {}
            shown = (
                status.get("phase"),
                (status.get("workers") or {}).get("summary"),
                (status.get("restarts") or {}).get("total"),
                status.get("reason"),
                (status.get("progress") or {}).get("stepSummary"),
            )
            if shown != last and status:
                row = self.kubectl("get", "trainingjobs", name, "-n", JOB_NAMESPACE, "-o", "wide",
                                   "--no-headers")  # fmt: skip
                self.echo(row.rstrip())
                last = shown
            if status.get("phase") in TERMINAL:
                return job
            self.finish_local_run()
            if self.local is None:
                gang = self._running_gang(name, nodes)
                if gang and self.preflight_passed(gang):
                    self.start_local_run(gang)
            time.sleep(0.5)
        raise DemoError(f"the job did not finish in {timeout:.0f}s; see {self.workdir}")

    def assert_operator_alive(self) -> None:
        if self.operator is not None and self.operator.poll() is not None:
            raise DemoError(f"the operator exited; see {self.workdir / 'operator.log'}")

    def stop(self) -> None:
        if self.local is not None:
            self.local.stop()
        if self.operator is not None and self.operator.poll() is None:
            self.operator.terminate()
            try:
                self.operator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.operator.kill()


def _flat(values: dict[str, Any], prefix: str = "") -> str:
    """{"a": 1, "b": {"c": 2}} as "a 1, b.c 2"."""
    parts = []
    for key, value in values.items():
        if isinstance(value, dict):
            parts.append(_flat(value, f"{prefix}{key}."))
        else:
            parts.append(f"{prefix}{key} {value}")
    return ", ".join(parts)


def _namespace_manifest(name: str) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def _service_account_name(manifests: str) -> str:
    for doc in yaml.safe_load_all(manifests):
        if doc and doc.get("kind") == "ServiceAccount":
            name: str = doc["metadata"]["name"]
            return name
    raise DemoError("the chart rendered no ServiceAccount")


def _training_script(name: str) -> Path:
    return REPO / "images" / "training" / "trainium_training" / name


def _training_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TRAINIUM_", "NEURON_", "XLA_", "PET_"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _local_path(value: str, shared: Path) -> str:
    """Maps the pod's shared-volume paths (/data/...) onto the local stand-in folder."""
    if value == SHARED_MOUNT or value.startswith(SHARED_MOUNT + "/"):
        return str(shared) + value[len(SHARED_MOUNT) :]
    if value.startswith("--cache_dir=" + SHARED_MOUNT):
        return "--cache_dir=" + _local_path(value.removeprefix("--cache_dir="), shared)
    return value


def run_demo(name: str, echo: Echo, *, tear_down: bool) -> int:
    _require_checkout()
    demo = Demo(name, echo)
    demo.workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        echo(f"== 1/5 local control plane '{name}' with two fake trn1.32xlarge nodes")
        demo.start_cluster()
        echo("== 2/5 the Helm chart's CRDs and RBAC")
        operator_kubeconfig = demo.install_chart_access()
        echo("== 3/5 the operator, with exactly the chart's ServiceAccount permissions")
        demo.start_operator(operator_kubeconfig)
        data = demo.make_data()
        echo(f"== 4/5 the tutorial's job (shared volume /data -> {demo.shared})")
        job_name = demo.apply_job()
        job = demo.watch(job_name, nodes=2)
        echo(f"== 5/5 {job['status']['phase']} after {time.monotonic() - started:.0f}s")
        profile_dir = Path(
            _local_path(job["status"].get("profile", {}).get("path", ""), demo.shared)
        )
        _print_next_steps(demo, job, profile_dir, data, echo)
        return 0 if job["status"]["phase"] == "Succeeded" else 1
    finally:
        demo.stop()
        if tear_down:
            cluster.down(name, echo=echo)


def _print_next_steps(
    demo: Demo, job: dict[str, Any], profile_dir: Path | None, data: Path, echo: Echo
) -> None:
    name = job["metadata"]["name"]
    if profile_dir is not None and profile_dir.is_dir():
        echo(f"$ trainium-operator profile report {profile_dir}")
        report = subprocess.run(
            [sys.executable, "-m", "trainium_operator", "profile", "report", str(profile_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
        echo("\n".join(report.stdout.splitlines()[:40]))
    lines = [
        "",
        "Where to look next:",
        f'  eval "$(trainium-operator dev env --name {demo.name})"',
        f"  kubectl describe trainingjob {name}          # conditions, stage times, events",
        f"  kubectl get pods -l trainium.dev/job-name={name} -o wide",
    ]
    if profile_dir is not None:
        lines += [
            f"  trainium-operator profile serve {profile_dir.parents[2]} --list-jobs "
            f"--kubeconfig {demo.kubeconfig}",
            "      # the profile UI, and the TrainingJobs live: step, rate, ETA, health",
            f"  trainium-operator profile export {profile_dir} --perfetto trace.perfetto-trace",
        ]
    lines += [
        f"  trainium-operator dev down --name {demo.name}",
        f"Operator log: {demo.workdir / 'operator.log'}; training logs and checkpoints under "
        f"{demo.workdir}; data: {data}",
    ]
    echo("\n".join(lines))
