"""Builds the simulator's compiled core with mypyc (everything else is in pyproject.toml).

The modules in ``llmlb_bench/compiled_core.py``'s MODULES are compiled into
``llmlb_bench/_compiled/`` together with a manifest of the sources they were built from; the
package loads them only while those sources are unchanged (see that module). Where the build
cannot run (no C compiler, no mypyc, a type error) the install goes on with the pure-Python core:
the manifest records why, and ``llmlb --version`` says so. ``python setup.py build_ext --inplace``
rebuilds the core of a source checkout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import traceback
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _core_module() -> Any:
    """llmlb_bench/compiled_core.py, loaded by path: importing the package would need its dependencies."""
    spec = importlib.util.spec_from_file_location("_llmlb_compiled_core",
                                                  os.path.join(HERE, "llmlb_bench", "compiled_core.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildCore(build_ext):
    """build_ext that runs mypyc first, puts the extensions under llmlb_bench/_compiled/ and
    writes the manifest; any failure is reported and leaves the pure-Python core."""

    def run(self) -> None:
        core = _core_module()
        out_dir = os.path.join(HERE if self.inplace else self.build_lib, core.PACKAGE, core.BUILD_DIR)
        shutil.rmtree(out_dir, ignore_errors=True)  # all generated: no module of an older build stays
        try:
            if os.environ.get(core.ENV, "").strip().lower() == "python":
                raise RuntimeError(f"skipped ({core.ENV}=python at install time)")
            self.extensions = self._mypyc_extensions(core) + self._kernel_extensions(core)
            self.check_extensions_list(self.extensions)
            for ext in self.extensions:  # setuptools copies in-place extensions without making their folder
                os.makedirs(os.path.join(out_dir, *ext.name.split(".")[2:-1]), exist_ok=True)
            super().run()
        except (Exception, SystemExit) as exc:  # mypyc exits on a type error; the compiler raises
            if not isinstance(exc, RuntimeError) or "skipped" not in str(exc):
                traceback.print_exc()
            if type(exc).__name__ in ("CompileError", "LinkError", "DistutilsExecError", "DistutilsPlatformError"):
                reason = f"{type(exc).__name__}: no working C compiler (the build log has the command)"
            else:
                reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            self._write_manifest(out_dir, core.build_manifest(HERE, False, reason))
            print(f"llmlb-bench: the compiled simulator core was not built ({reason}); "
                  f"the pure-Python core will run", file=sys.stderr)
            return
        self._write_manifest(out_dir, core.build_manifest(HERE, True))
        print(f"llmlb-bench: compiled simulator core built ({len(core.MODULES)} modules, mypyc)", file=sys.stderr)

    def _mypyc_extensions(self, core: Any) -> list[Extension]:
        """mypyc's extensions, renamed into the build directory: the shims' ``PyInit`` keeps the
        module's own last name, so only where the file lands changes."""
        from mypyc.build import mypycify

        old = os.getcwd()
        os.chdir(HERE)  # mypy reads pyproject.toml's [tool.mypy] (strict) from here
        try:
            paths = [os.path.join(*m.split(".")) + ".py" for m in core.MODULES]
            exts: list[Extension] = mypycify(paths, group_name=core.GROUP, opt_level="3",
                                             target_dir=os.path.join(self.build_temp, "mypyc"))
        finally:
            os.chdir(old)
        prefix = f"{core.PACKAGE}.{core.BUILD_DIR}."
        for ext in exts:
            if not ext.name.startswith(prefix):  # a core module's shim (the group's library is there already)
                ext.name = prefix + ext.name.split(".", 1)[1]
            # what setuptools' finalize_options sets on the extensions it was given
            ext._full_name = self.get_ext_fullname(ext.name)  # type: ignore[attr-defined]
            ext._links_to_dynamic = ext._needs_stub = False  # type: ignore[attr-defined]
            ext._file_name = self.get_ext_filename(ext._full_name)  # type: ignore[attr-defined]
            self.ext_map[ext._full_name] = ext  # type: ignore[attr-defined]
        return exts

    def _kernel_extensions(self, core: Any) -> list[Extension]:
        """The report's C kernels (``compiled_core.KERNELS``), built under the same directory; no
        multiply-add fused, so that they compute what NumPy's separate passes compute, bit for bit."""
        exts = []
        for name, source in core.KERNELS.items():
            ext = Extension(f"{core.PACKAGE}.{core.BUILD_DIR}.{name.split('.', 1)[1]}", sources=[source],
                            depends=list(core.KERNEL_HEADERS),
                            extra_compile_args=["-O2", "-ffp-contract=off", "-fno-fast-math"])
            ext._full_name = self.get_ext_fullname(ext.name)  # type: ignore[attr-defined]
            ext._links_to_dynamic = ext._needs_stub = False  # type: ignore[attr-defined]
            ext._file_name = self.get_ext_filename(ext._full_name)  # type: ignore[attr-defined]
            self.ext_map[ext._full_name] = ext  # type: ignore[attr-defined]
            exts.append(ext)
        return exts

    @staticmethod
    def _write_manifest(out_dir: str, manifest: dict[str, Any]) -> None:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "manifest.json"), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)


# one placeholder extension: setuptools then runs build_ext (and builds a platform wheel); BuildCore
# replaces it with mypyc's extensions when the build runs, not on every call of this file
setup(ext_modules=[Extension("llmlb_bench._compiled.core__mypyc", sources=[])], cmdclass={"build_ext": BuildCore})
