import sys
from pathlib import Path

# Test helpers (modfactory, ckptfactory, vllmenv, dockerimg) live beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dockerimg import base_image, docker_engine, ray_image, sandbox_image  # noqa: F401  (fixtures for docker tests)
