"""`python -m effvision.cli` (how torchrun relaunches `effvision train --nproc N`)."""

from .main import entry

entry()
