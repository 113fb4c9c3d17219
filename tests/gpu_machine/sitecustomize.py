"""Makes this interpreter import like the GPU machine's python3, for the rehearsal of the GPU plan
(tests/test_gpu_plan.py). Python runs this file at start-up when its folder is on PYTHONPATH and
EFFVISION_GPU_MACHINE is set:

- every installed distribution that machine lacks (effvision.gpu_plan.GPU_MACHINE) is hidden: its
  imports fail as if it were absent;
- EFFVISION_GPU_MACHINE=wheels-from-venv leaves the distributions the plan carries as wheels
  importable from this environment; EFFVISION_GPU_MACHINE=bare hides them too (the carried
  wheels themselves must then be on PYTHONPATH);
- EFFVISION_GPU_MACHINE_HIDE=a,b hides these import names as well (to break the plan on purpose);
- EFFVISION_GPU_MACHINE_FAULT=torch.compile:AttributeError makes that function raise, as a library
  built for another torch would;
- EFFVISION_GPU_MACHINE_MODULES=FILE: each process writes FILE.<pid> at exit, the top-level modules it imported.
"""

import os
import sys

MODE = os.environ.get("EFFVISION_GPU_MACHINE")


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


class _Hider:
    """Finds a hidden top-level module only on PYTHONPATH (where carried wheels are unpacked),
    never in this environment's site-packages."""

    def __init__(self, hidden):
        self.hidden = frozenset(hidden)
        self.paths = [
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != os.path.dirname(__file__)
        ]

    def find_spec(self, name, path=None, target=None):
        if "." in name or name not in self.hidden:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, self.paths)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r} (not on the GPU machine)", name=name)
        return spec


def _install():
    from importlib import metadata

    from packaging.requirements import Requirement

    from effvision.gpu_plan import GPU_MACHINE, WHEELS

    sys.modules.pop("effvision.gpu_plan")  # `python -m effvision.gpu_plan` runs it afresh, without a warning

    carried = {_norm(d) for d in WHEELS}
    allowed = set(GPU_MACHINE) | (carried if MODE == "wheels-from-venv" else set())
    # what those distributions need here comes with them there (that machine's versions bring their
    # own), except what the plan carries: typer here needs pydantic, that machine's typer does not
    todo = list(allowed)
    while todo:
        try:
            needs = metadata.requires(todo.pop()) or []
        except metadata.PackageNotFoundError:
            continue
        for text in needs:
            req = Requirement(text)
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue
            name = _norm(req.name)
            if name not in allowed and name not in carried:
                allowed.add(name)
                todo.append(name)
    hidden = {
        module
        for module, dists in metadata.packages_distributions().items()
        if module not in sys.stdlib_module_names
        and module != "effvision"
        and not any(_norm(d) in allowed for d in dists)
    }
    hidden |= set(filter(None, os.environ.get("EFFVISION_GPU_MACHINE_HIDE", "").split(",")))
    # a module the carried wheels provide is found on PYTHONPATH, never in this environment
    sys.meta_path.insert(0, _Hider(hidden))

    fault = os.environ.get("EFFVISION_GPU_MACHINE_FAULT")
    if fault:
        import builtins
        import importlib

        where, _, exc_name = fault.partition(":")
        module_name, _, attr = where.rpartition(".")
        module = importlib.import_module(module_name)
        exc_type = getattr(builtins, exc_name)

        def broken(*args, **kwargs):
            raise exc_type(f"{where} is broken on purpose (a library built for another torch)")

        setattr(module, attr, broken)

    record = os.environ.get("EFFVISION_GPU_MACHINE_MODULES")
    if record:
        import atexit

        def dump():
            with open(f"{record}.{os.getpid()}", "w") as f:  # one file per process: the speed run starts one
                f.write("\n".join(sorted({m.partition(".")[0] for m in list(sys.modules)})))

        atexit.register(dump)


if MODE:
    _install()
