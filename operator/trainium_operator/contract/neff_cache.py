"""The native stack's persistent NEFF cache: its variables, its layout on the shared volume, and
the summary a compile pod leaves for the operator.

TorchNeuron (the native Neuron PyTorch backend) compiles each graph just in time and keeps the
NEFF in a persistent cache named by TORCH_NEURONX_NEFF_CACHE_DIR (Neuron docs, "Compiler
artifacts" and the Neuron Explorer profiling how-to; default /tmp/neff_cache, files *.neff).
The compile stage runs the training command for spec.compile.steps steps with the cache on the
shared volume, training runs with the same directory, and its first steps hit the cache.

The directory is keyed so entries of two compilers or two logical-core configs never mix, and,
as on the XLA stack, one per node rank: no source confirms that several nodes may write one
cache on FSx (the backend's source describes NFS-safe atomic writes, but its locks are
node-local), and compile pod r warms exactly what training pod r reads.

The compile pod's last act is `SUMMARY_SCRIPT`: it writes what the cache holds (NEFF files and
their bytes) to the container's termination message, which the operator reads back with
`parse_summary` into status.compile.cache. The operator cannot read the volume itself; a pod
that ends without a summary leaves the figure unknown, never zero.

Standard library only: the training image imports this module without our dependencies.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

# TorchNeuron's documented cache variable.
NEFF_CACHE_DIR_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
NEFF_SUFFIX = ".neff"
# Named only by third-party code (vLLM Neuron): settings that default off (spec.neuron).
COMPILE_ONLY_ENV = "TORCH_NEURONX_COMPILE_ONLY"
HLO_CACHE_DIR_ENV = "TORCH_NEURONX_HLO_CACHE_DIR"
HLO_COMPILE_CACHE_ENV = "TORCH_NEURONX_HLO_COMPILE_CACHE"

NATIVE_CACHE_SUBDIR = "native"  # <cache root>/native/...: apart from the XLA stack's caches
NEFF_SUBDIR = "neff"
HLO_SUBDIR = "hlo"
IMAGE_KEY_PREFIX = "image-"
# Kubernetes' default terminationMessagePath; the kubelet keeps at most 4096 bytes of it.
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
SUMMARY_KIND = "trainium.dev/neff-cache-summary"


def image_cache_key(image: str) -> str:
    """The cache key when the compiler version is not given: the image stands for its
    compiler (a new image starts a new, cold cache; never a wrong one)."""
    return IMAGE_KEY_PREFIX + hashlib.sha256(image.encode()).hexdigest()[:12]


def native_cache_dir(root: str, cache_set: str, rank: int, compiler_key: str, lnc: int) -> str:
    """<root>/native/<cacheSet>_<rank>/<compiler key>/lnc-<N>: the cache set's directory for one
    node rank, one compiler and one logical NeuronCore config."""
    return f"{root.rstrip('/')}/{NATIVE_CACHE_SUBDIR}/{cache_set}_{rank}/{compiler_key}/lnc-{lnc}"


def neff_dir(cache_dir: str) -> str:
    return f"{cache_dir}/{NEFF_SUBDIR}"


def hlo_dir(cache_dir: str) -> str:
    return f"{cache_dir}/{HLO_SUBDIR}"


# Run as `sh -c SUMMARY_SCRIPT sh <argv...>`: the shell is PID 1, passes SIGTERM on to the
# command (torchrun) and exits with its code; after a success it counts the NEFF files under
# $TORCH_NEURONX_NEFF_CACHE_DIR and writes one JSON line to the termination message. A missing
# directory or a failed listing says so ("readable": false) instead of counting zero.
SUMMARY_SCRIPT = (
    "term=0; "
    "trap 'term=1; kill -TERM \"$child\" 2>/dev/null' TERM INT; "
    '"$@" & child=$!; '
    'wait "$child"; rc=$?; '
    'if [ "$term" = 1 ]; then wait "$child"; rc=$?; fi; '
    'if [ "$rc" = 0 ]; then '
    f'd="${NEFF_CACHE_DIR_ENV}"; '
    'if [ -d "$d" ] && s=$(find "$d" -type f -name '
    f"'*{NEFF_SUFFIX}' -printf '%s\\n'); then "
    'printf \'%s\\n\' "$s" | awk -v d="$d" '
    f'\'NF {{ n++; b += $1 }} END {{ printf "{{\\"kind\\":\\"{SUMMARY_KIND}\\",'
    '\\"readable\\":true,\\"programs\\":%d,\\"bytes\\":%.0f,\\"dir\\":\\"%s\\"}\\n", '
    f"n, b, d }}' > {TERMINATION_MESSAGE_PATH}; "
    f'else printf \'{{"kind":"{SUMMARY_KIND}","readable":false,"dir":"%s"}}\\n\' '
    f'"$d" > {TERMINATION_MESSAGE_PATH}; fi; '
    "fi; exit $rc"
)


@dataclass(frozen=True, slots=True)
class CacheSummary:
    """One compile pod's NEFF cache: None figures when the pod could not list it."""

    readable: bool
    programs: int | None
    bytes: int | None
    directory: str | None


def parse_summary(message: str | None) -> CacheSummary | None:
    """The summary in a compile pod's termination message; None when there is none (the pod
    ended before writing it, or the message is something else, such as an error's tail)."""
    if not message:
        return None
    for line in reversed(message.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if not isinstance(data, dict) or data.get("kind") != SUMMARY_KIND:
            continue
        directory = data.get("dir")
        directory = directory if isinstance(directory, str) else None
        programs, size = _count(data.get("programs")), _count(data.get("bytes"))
        if data.get("readable") is True and programs is not None and size is not None:
            return CacheSummary(True, programs, size, directory)
        return CacheSummary(False, None, None, directory)
    return None


def _count(value: object) -> int | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return None
