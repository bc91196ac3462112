"""The distributed start: jax.distributed for the processes of a job (given as flags, or found
by jax on Cloud TPU VMs, GKE, SLURM and Open MPI), and SIGTERM as a step to stop at
(Preemption). Used by the programs (train.py, eval.py) and the training loop (training.py).
"""
import os
import signal
import threading

import jax
from absl import flags


def process_flags():
  """--coordinator_address, --num_processes, --process_id: the flags of every program that runs
  on several processes (train, eval); `init_distributed` takes their values."""
  return (flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (leave out '
                              'on TPU VMs, GKE, SLURM: jax finds it).'),
          flags.DEFINE_integer('num_processes', None, 'Processes in the job.'),
          flags.DEFINE_integer('process_id', None, 'This process.'))


# Where jax.distributed.initialize() finds the processes by itself (its cluster detection):
# GKE TPU pods (TPU_WORKER_HOSTNAMES), SLURM (SLURM_NTASKS), Open MPI (OMPI_COMM_WORLD_SIZE).
# Cloud TPU VMs (`gcloud compute tpus tpu-vm`) set none of these: there jax asks the VM's
# metadata server (agent-worker-number, worker-network-endpoints), once it has seen TPU chips
# on the PCI bus; we look for the chips the same way.
_CLUSTER_ENV = ('TPU_WORKER_HOSTNAMES', 'SLURM_NTASKS', 'OMPI_COMM_WORLD_SIZE')


def _on_cloud_tpu_vm() -> bool:
  try:  # jax's own check (private: any failure means no TPU found).
    from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel
    return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
  except Exception:  # pylint: disable=broad-except
    return False


def init_distributed(coordinator=None, num_processes=None, process_id=None):
  """jax.distributed for several processes: given explicitly (--coordinator_address,
  --num_processes, --process_id), or found by jax on Cloud TPU VMs, GKE, SLURM and Open MPI."""
  if coordinator or num_processes or process_id is not None:
    if not (coordinator and num_processes and process_id is not None):
      raise ValueError(f'--coordinator_address={coordinator} --num_processes={num_processes} '
                       f'--process_id={process_id}: give all three, or none to let jax find '
                       'them (TPU VMs, GKE, SLURM).')
    jax.distributed.initialize(coordinator, num_processes, process_id)
  elif os.environ.get('TPU_WORKER_HOSTNAMES') or any(
      int(os.environ.get(v, '1') or '1') > 1 for v in _CLUSTER_ENV[1:]) or _on_cloud_tpu_vm():
    jax.distributed.initialize()


class Preemption:
  """SIGTERM (a spot VM's preemption, a maintenance event, `kill`) as a step to stop at.

  One process: our handler notes the signal. Several: JAX's preemption notifier (started by
  jax.distributed.initialize) catches SIGTERM in any process, and
  multihost_utils.reached_preemption_sync_point(step), called by every process at every step,
  is true at the same step in all of them.
  """

  def __init__(self):
    self.multi = jax.process_count() > 1
    self.cause, self._previous = None, None
    if not self.multi and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._note)

  def _note(self, signum, frame):
    del frame
    self.cause = f'Preempted ({signal.Signals(signum).name})'

  def reached(self, step: int) -> bool:
    if not self.multi:
      return self.cause is not None
    from jax.experimental import multihost_utils
    if multihost_utils.reached_preemption_sync_point(step):
      self.cause = 'Preempted (SIGTERM in one of the processes)'
      return True
    return False

  def close(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
