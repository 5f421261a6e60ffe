"""The GPU dependency set (constraints/verl-0.9.1-gpu.txt, benchmarks/checks/resolve_gpu_stack.py) without the network: the
constraints pin what the installed verl pins in its own ``vllm`` extra, and satisfy this project's own requirements.
Whether pip resolves the whole set needs the package registry: `make gpu-resolve` (benchmarks/RESULTS.md)."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.fakes import import_benchmark

ROOT = Path(__file__).resolve().parents[1]
resolve_gpu_stack = import_benchmark("checks.resolve_gpu_stack")

PINS = resolve_gpu_stack.pinned_versions(resolve_gpu_stack.CONSTRAINTS)


def _our_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(text) for text in project["dependencies"] + extras["verl"] + extras["vllm"]]


def test_the_constraints_pin_what_verls_own_vllm_extra_pins():
    try:
        requires = importlib.metadata.requires("verl") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("verl is not installed (make setup installs verl==0.9.1 with --no-deps)")
    assert importlib.metadata.version("verl") == PINS["verl"]
    pinned = {}
    for text in requires:
        requirement = Requirement(text)
        if requirement.marker is not None and 'extra == "vllm"' in str(requirement.marker):
            exact = re.fullmatch(r"==(\S+)", str(requirement.specifier))
            if exact:
                pinned[requirement.name.lower()] = exact.group(1)
    assert pinned and pinned == {name: PINS[name] for name in pinned}
    assert set(PINS) == set(pinned) | {"verl"}


def test_the_constraints_satisfy_our_own_requirements_and_verls():
    """A version our code needs but the constraints forbid would be a defect (pip would refuse the set)."""
    for requirement in _our_requirements():
        name = requirement.name.lower()
        if name in PINS:
            assert requirement.specifier.contains(PINS[name]), f"{requirement} excludes the pinned {PINS[name]}"
    for text in importlib.metadata.requires("verl") or []:
        requirement = Requirement(text)
        if requirement.marker is None and requirement.name.lower() in PINS:
            assert requirement.specifier.contains(PINS[requirement.name.lower()]), requirement


def test_a_constraints_line_that_is_not_an_exact_pin_is_refused_naming_file_and_line(tmp_path):
    path = tmp_path / "constraints.txt"
    path.write_text("# comment\ntorch==2.11.0\nvllm>=0.24\n")
    with pytest.raises(ValueError, match=r"constraints.txt:3: expected name==version, got 'vllm>=0.24'"):
        resolve_gpu_stack.pinned_versions(path)


def test_the_report_reader_takes_pips_installation_report():
    report = {"install": [{"metadata": {"name": "Torch", "version": "2.11.0"}},
                          {"metadata": {"name": "vllm", "version": "0.24.0"}}]}
    assert resolve_gpu_stack.resolved_versions(report) == {"torch": "2.11.0", "vllm": "0.24.0"}
