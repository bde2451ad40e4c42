"""Builds the Python package `eplb`: the extension eplb._eplb through CMake
(only that target and the libraries it links: common, placement, policy,
plan, and for migration xfer (UCX), bootstrap and migrate), and the
pure-Python modules in python/eplb.

The CMake build directory is build-python/cmake inside the repository (or
$EPLB_PYTHON_BUILD_DIR), kept between installs so a re-install only
recompiles what changed. $EPLB_JOBS limits the parallel compile jobs;
$EPLB_CMAKE_ARGS adds CMake arguments (scripts/sanitize.sh python-asan
builds a sanitized extension this way).
The version comes from CMakeLists.txt's project(eplb VERSION ...), the one
source of truth the CLI's --version uses as well.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def project_version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"project\(eplb\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", text)
    if not match:
        raise RuntimeError("CMakeLists.txt: no 'project(eplb VERSION x.y.z' line")
    return match.group(1)


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures the project with only the Python extension enabled and builds the one target."""

    def build_extension(self, ext: Extension) -> None:
        build_dir = Path(os.environ.get("EPLB_PYTHON_BUILD_DIR", ROOT / "build-python" / "cmake"))
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DEPLB_BUILD_TESTS=OFF", "-DEPLB_BUILD_BENCH=OFF", "-DEPLB_BUILD_FUZZERS=OFF",
            "-DEPLB_BUILD_PYTHON=ON",
            f"-DPython_EXECUTABLE={sys.executable}",
        ] + shlex.split(os.environ.get("EPLB_CMAKE_ARGS", ""))
        if not (build_dir / "CMakeCache.txt").exists() and shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        jobs = os.environ.get("EPLB_JOBS", str(os.cpu_count() or 1))
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "_eplb", "--parallel", jobs], check=True)
        built = sorted((build_dir / "python").glob("_eplb*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected one _eplb*.so in {build_dir / 'python'}, found {built}")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], target)


BUILD = ROOT / "build-python"
BUILD.mkdir(exist_ok=True)

setup(
    version=project_version(),
    ext_modules=[CMakeExtension("eplb._eplb")],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": str(BUILD / "setuptools")}, "egg_info": {"egg_base": str(BUILD)}},
)
