"""Everything about the package is in pyproject.toml; this file only builds the top-level
``configs/`` directory into the wheel as ``agentgym/configs`` (the repository keeps it at the
top level, where a checkout and an editable install find it; ``agentgym.config.config_dir``
looks for the packaged copy in an installed wheel)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CONFIGS = Path(__file__).resolve().parent / "configs"


class build_py_with_configs(build_py):  # noqa: N801 - setuptools' command naming
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads configs/ from the checkout
        target = Path(self.build_lib) / "agentgym" / "configs"
        shutil.rmtree(target, ignore_errors=True)
        for source in sorted(CONFIGS.rglob("*.yaml")):
            destination = target / source.relative_to(CONFIGS)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)


setup(cmdclass={"build_py": build_py_with_configs})
