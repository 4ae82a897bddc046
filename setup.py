"""What pyproject.toml cannot say: the image sources (`images/`, a top-level folder of the repository) go into the
wheel as package data (`pp_launch/_images`), so that an installed pp-launch builds its images with no source tree
(`pp-launch images build`; adapters/images.py, images_dir); and so does `wrappers/docker-gpu-node.sh`, the old entry
point (`pp_launch/_wrappers`; `pp-gpu-node --help` says where it is)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

IMAGES = Path(__file__).resolve().parent / "images"
WRAPPERS = Path(__file__).resolve().parent / "wrappers"


class BuildWithImages(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install reads images/ where it is
            return
        target = Path(self.build_lib) / "pp_launch" / "_images"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(IMAGES, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        wrappers = Path(self.build_lib) / "pp_launch" / "_wrappers"
        shutil.rmtree(wrappers, ignore_errors=True)
        shutil.copytree(WRAPPERS, wrappers)


setup(cmdclass={"build_py": BuildWithImages})
