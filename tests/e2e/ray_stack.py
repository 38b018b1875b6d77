"""A real Ray head with token auth, and dispatchers and worker nodes beside it: the names the e2e tests
import from here live in tests/factories/processes.py, shared with bench/."""

from tests.factories.processes import Dispatchers as Dispatchers
from tests.factories.processes import MultiNode as MultiNode
from tests.factories.processes import one_start_at_a_time as one_start_at_a_time
from tests.factories.processes import secrets_path as secrets_path
from tests.factories.processes import start_ray_head as start_ray_head
from tests.factories.processes import stop_ray_head as stop_ray_head
