"""The CUDA Agent paper's workspace layout, built as its compile script builds it.

A solution in that layout (tasks/solution.py: kernels/*.cu with a *_binding.cpp each, a
model_new.py that imports ``cuda_extension``) is one extension module made from every .cu and
.cpp at its root and in kernels/. Its two fixed files, the binding registry header and the
binding.cpp that applies the registrations, come from here, never from the candidate: written
over whatever the solution holds under those names. They are this project's own text, written
to the released header's interface (``REGISTER_BINDING(name, func)``), not copies of it.

The build runs in the sandboxed import child (env_pool/candidate/runner.py), under the compile limit, into
the scratch folder's TORCH_EXTENSIONS_DIR: the code sampler counts the library it leaves as the
candidate's own code, the inline cache keeps it, and the round server loads it without building
(env_pool/candidate/serve.py's use_prebuilt_extensions).
"""
from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

from env_pool.build.compile import EXTENSIONS
from tasks.solution import EXTENSION_MODULE, FIXED_FILES, extension_sources, solution_names

REGISTRY_HEADER = """\
#pragma once
// The binding registry of the paper's workspace layout, supplied by the environment: each
// kernels/*_binding.cpp registers a function that adds its bindings to the module, and
// binding.cpp applies them all when the module is imported.
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;

// Hidden, as pybind11's own types are: one registry per extension module (its own .so).
class __attribute__((visibility("hidden"))) BindingRegistry {
 public:
  using BindingFunction = std::function<void(pybind11::module&)>;

  static BindingRegistry& getInstance() {
    static BindingRegistry registry;
    return registry;
  }
  void registerBinding(const std::string& name, BindingFunction add) { entries_.emplace_back(name, std::move(add)); }
  void applyBindings(pybind11::module& m) {
    for (auto& entry : entries_) entry.second(m);
  }

 private:
  BindingRegistry() = default;
  std::vector<std::pair<std::string, BindingFunction>> entries_;
};

struct __attribute__((visibility("hidden"))) BindingRegistrar {
  BindingRegistrar(const std::string& name, BindingRegistry::BindingFunction add) {
    BindingRegistry::getInstance().registerBinding(name, std::move(add));
  }
};

#define REGISTER_BINDING(name, func) \\
  static BindingRegistrar binding_registrar_##name(#name, [](pybind11::module& m) { func(m); })
"""

BINDING_CPP = f"""\
// The module of the paper's workspace layout, supplied by the environment: every binding that
// kernels/*_binding.cpp registers is added to it.
#include <pybind11/pybind11.h>
#include "binding_registry.h"

PYBIND11_MODULE({EXTENSION_MODULE}, m) {{ BindingRegistry::getInstance().applyBindings(m); }}
"""

FIXED_TEXT = dict(zip(FIXED_FILES, (BINDING_CPP, REGISTRY_HEADER)))
assert set(FIXED_TEXT) == set(FIXED_FILES)


def install_fixed_files(scratch: Path) -> None:
    """The environment's binding.cpp and registry header, over the solution's own (if any)."""
    for name, text in FIXED_TEXT.items():
        target = scratch / name
        if target.is_symlink() or target.exists():
            target.unlink()
        target.write_text(text)


def build_directory(scratch: Path) -> Path:
    return scratch / EXTENSIONS / EXTENSION_MODULE


def load_extension(scratch: Path, backend: str, fast_math: bool) -> ModuleType:
    """Build (in the import child) or load (in a server, where use_prebuilt_extensions stops any
    build) the solution's cuda_extension, and make ``import cuda_extension`` find it.

    The paper's flags: -O3 (and C++17) for the host compiler, -O3 and --use_fast_math for nvcc
    (fast math only where the rules allow it: env.rules). The cpp backend builds the same layout
    with .cpp kernels for the CPU, OpenMP on as for its kernel.cpp."""
    from torch.utils import cpp_extension

    sources = [str(scratch / name) for name in extension_sources(solution_names(scratch))]
    cuda = backend == "cuda"
    out = build_directory(scratch)
    out.mkdir(parents=True, exist_ok=True)
    module = cpp_extension.load(
        name=EXTENSION_MODULE, sources=sources, build_directory=str(out), verbose=False, with_cuda=cuda,
        extra_cflags=["-O3", "-std=c++17"] + ([] if cuda else ["-march=native", "-fopenmp"]),
        extra_cuda_cflags=["-O3"] + (["--use_fast_math"] if fast_math else []),
        extra_ldflags=[] if cuda else ["-fopenmp"])
    sys.modules[EXTENSION_MODULE] = module  # load() imports it without registering the name
    return module
