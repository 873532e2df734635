"""`make env`'s llama.cpp wheel cache: keyed by the pinned version and the build settings, built lean."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def planned(tmp_path, *overrides: str) -> str:
    """The commands `make env` would run for a fresh environment (nothing is run)."""
    return subprocess.run(["make", "-n", "env", f"VENV={tmp_path}/venv", f"WHEEL_CACHE={tmp_path}/wheels", *overrides],
                          cwd=REPO, capture_output=True, text=True, check=True).stdout


def wheel_dir(plan: str) -> str:
    return re.search(r"wheels/(llama-cpp-python-[0-9.]+-[0-9a-f]{12})/\*\.whl", plan).group(1)


def test_the_wheel_is_built_once_per_version_and_settings(tmp_path):
    pinned = re.search(r'"llama-cpp-python==([0-9.]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    plan = planned(tmp_path)
    assert f"'llama-cpp-python=={pinned}'" in plan and wheel_dir(plan).startswith(f"llama-cpp-python-{pinned}-")
    # Only what the Python package loads is compiled.
    assert "-DLLAVA_BUILD=OFF" in plan and "-DCMAKE_UNITY_BUILD=ON" in plan
    assert f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={REPO}/packaging/llama-cpp-skip-common.cmake" in plan
    assert "set(LLAMA_BUILD_COMMON OFF" in (REPO / "packaging/llama-cpp-skip-common.cmake").read_text()
    # Other flags, another cached wheel; the same flags for another venv and cache folder, the same key (no paths).
    assert wheel_dir(planned(tmp_path, "LLAMA_CMAKE_FLAGS=-DGGML_NATIVE=ON")) != wheel_dir(plan)
    assert wheel_dir(planned(tmp_path / "elsewhere")) == wheel_dir(plan)



def cmake_args(plan: str) -> list[str]:
    return re.search(r'CMAKE_ARGS="([^"]*)"', plan).group(1).split()


def test_avx512_kernels_follow_the_cpu_and_can_be_turned_off(tmp_path):
    info = Path("/proc/cpuinfo")
    cpu = set(re.search(r"^flags\s*:(.*)$", info.read_text(), re.M).group(1).split()) if info.exists() else set()
    args = cmake_args(planned(tmp_path))
    has_avx512 = {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"} <= cpu
    assert ("-DGGML_AVX512=ON" in args) == has_avx512
    assert ("-DGGML_AVX512_VNNI=ON" in args) == (has_avx512 and "avx512_vnni" in cpu)
    assert "-DGGML_NATIVE=OFF" in args and not any("AMX" in a for a in args)
    portable = cmake_args(planned(tmp_path, "LLAMA_AVX512="))
    assert "-DGGML_AVX2=ON" in portable and not any("AVX512" in a for a in portable)
    # Every base AVX-512 flag is needed; each extension is added on its own.
    part = cmake_args(planned(tmp_path, "CPU_FLAGS=avx2 avx512f avx512_vnni"))
    assert not any("AVX512" in a for a in part)
    full = cmake_args(planned(tmp_path, "CPU_FLAGS=avx2 avx512f avx512cd avx512vl avx512dq avx512bw avx512_bf16"))
    assert [a for a in full if "AVX512" in a] == ["-DGGML_AVX512=ON", "-DGGML_AVX512_BF16=ON"]
