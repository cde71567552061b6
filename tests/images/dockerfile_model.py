"""A small reader for our Dockerfiles and their .dockerignore files (no Docker needed).

We cannot build images here, so the image tests read the Dockerfiles: hadolint lints them, and
these helpers expose their instructions, stages and build-context filter to content tests.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_DOCKERFILE = ROOT / "images" / "operator" / "Dockerfile"
TRAINING_DOCKERFILE = ROOT / "images" / "training" / "Dockerfile"
# The native Neuron stack's training image (TorchNeuron): the same package on another base.
TRAINING_NATIVE_DOCKERFILE = ROOT / "images" / "training" / "Dockerfile.native"
TRAINING_DOCKERFILES = {
    "training": TRAINING_DOCKERFILE,
    "training-native": TRAINING_NATIVE_DOCKERFILE,
}


@dataclass(frozen=True, slots=True)
class Instruction:
    keyword: str
    arguments: str

    def exec_form(self) -> list[str]:
        parsed = json.loads(self.arguments)
        assert isinstance(parsed, list), f"{self.keyword} is not in exec (JSON) form"
        return [str(part) for part in parsed]

    def flags_and_operands(self) -> tuple[dict[str, str], list[str]]:
        """`--flag=value` options and the remaining operands (COPY, RUN --mount, ...)."""
        flags: dict[str, str] = {}
        operands: list[str] = []
        for word in shlex.split(self.arguments):
            if word.startswith("--") and not operands:
                name, _, value = word[2:].partition("=")
                flags[name] = value
            else:
                operands.append(word)
        return flags, operands


def parse_instructions(text: str) -> list[Instruction]:
    """Instructions with line continuations joined and comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, arguments = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
    return instructions


def parse_env(arguments: str) -> dict[str, str]:
    """`ENV A=1 B="x y"` (the key=value form) as a dict."""
    pairs: dict[str, str] = {}
    for word in shlex.split(arguments):
        key, sep, value = word.partition("=")
        assert sep, f"ENV uses the legacy `ENV key value` form: {arguments}"
        pairs[key] = value
    return pairs


@dataclass
class Dockerfile:
    path: Path

    @cached_property
    def instructions(self) -> list[Instruction]:
        return parse_instructions(self.path.read_text())

    @cached_property
    def global_args(self) -> dict[str, str]:
        """ARG defaults declared before the first FROM (usable in FROM lines)."""
        args: dict[str, str] = {}
        for instruction in self.instructions:
            if instruction.keyword == "FROM":
                break
            if instruction.keyword == "ARG":
                name, _, default = instruction.arguments.partition("=")
                args[name] = default
        return args

    def stages(self) -> list[tuple[str, list[Instruction]]]:
        """(image reference with ARG defaults substituted, instructions) of each stage."""
        stages: list[tuple[str, list[Instruction]]] = []
        for instruction in self.instructions:
            if instruction.keyword == "FROM":
                image = instruction.arguments.split()[0]
                image = re.sub(
                    r"\$\{?(\w+)\}?", lambda m: self.global_args.get(m.group(1), m.group(0)), image
                )
                stages.append((image, []))
            elif stages:
                stages[-1][1].append(instruction)
        return stages

    def stage_names(self) -> set[str]:
        return {
            i.arguments.split()[-1]
            for i in self.instructions
            if i.keyword == "FROM" and " AS " in i.arguments.upper()
        }

    def final_stage(self) -> list[Instruction]:
        return self.stages()[-1][1]

    def final(self, keyword: str) -> list[Instruction]:
        return [i for i in self.final_stage() if i.keyword == keyword]

    def final_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for instruction in self.final("ENV"):
            env.update(parse_env(instruction.arguments))
        return env


# --- .dockerignore ---------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


@dataclass(frozen=True)
class DockerIgnore:
    """BuildKit's .dockerignore rules: the last matching pattern wins; a pattern that matches a
    directory matches everything under it; `!` re-includes."""

    rules: tuple[tuple[bool, re.Pattern[str]], ...]

    @classmethod
    def read(cls, path: Path) -> DockerIgnore:
        rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            pattern = line[1:] if negated else line
            pattern = pattern.strip("/")
            rules.append((negated, _pattern_regex(pattern)))
        return cls(tuple(rules))

    def includes(self, relative: str) -> bool:
        parts = relative.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        excluded = False
        for negated, regex in self.rules:
            if any(regex.match(prefix) for prefix in prefixes):
                excluded = not negated
        return not excluded


def assemble_copies(
    dockerfile: Dockerfile, root: Path, *, under: str = "/", sources: tuple[str, ...] = ("",)
) -> Path:
    """The final stage's COPY lines whose source starts with one of `sources`, reproduced from
    the build context into `root`, which stands for the image's `under` directory."""
    for copy in dockerfile.final("COPY"):
        flags, (source, destination) = copy.flags_and_operands()
        if not source.startswith(sources):
            continue
        assert "from" not in flags, "a COPY --from needs the build stage; not assembled here"
        target = root / destination.removeprefix(under)
        if source.endswith("/"):
            shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / source, target)
    return root


def build_operator_wheel(out: Path) -> Path:
    """The operator wheel, built the way images/operator/Dockerfile builds it (pip wheel of the
    checkout), from a copy so no build/ directory is left in the checkout."""
    build_root = out / "src"
    build_root.mkdir()
    for part in ("operator", "pyproject.toml", "README.md"):
        subprocess.run(["cp", "-r", str(ROOT / part), str(build_root)], check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         str(build_root), "-w", str(out / "dist")],
        check=True, capture_output=True,
    )  # fmt: skip
    (path,) = (out / "dist").glob("trainium_operator-*.whl")
    return path
