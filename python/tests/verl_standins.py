# SPDX-License-Identifier: Apache-2.0
"""Empty modules for the training-only packages that veRL's worker and trainer modules import at
their top (verl/workers/engine_workers.py, verl/trainer/ppo/v1/) and that the frameworks venv
lacks: its veRL is installed without dependencies (they pin transformers < 5.11). The weight sync
never calls them. install() puts a finder at the end of sys.meta_path, so only names that do not
exist here are stood in (a package's submodules with it); STOOD_IN lists them."""
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

NAMES = ("datasets", "pandas", "transfer_queue", "hydra", "torchdata", "peft", "accelerate")
STOOD_IN = []


class Empty(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {})
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in STOOD_IN:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return Empty(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def add(top):
    """Stands in `top` when it is not installed; whether it was added."""
    if not top or top in STOOD_IN or importlib.util.find_spec(top) is not None:
        return False
    STOOD_IN.append(top)
    return True


def install():
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
    for top in NAMES:
        add(top)
    return STOOD_IN
