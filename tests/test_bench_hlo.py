"""liere_jax/bench/hlo.py: the HBM traffic read from a compiled module's HLO text (bench
compile's parts of a step and largest instructions)."""
from liere_jax.bench.hlo import hlo_traffic

HLO = """HloModule m

%fused (p: f32[8,8]) -> f32[8,8] {
  %p = f32[8,8]{1,0} parameter(0)
  ROOT %n = f32[8,8]{1,0} negate(%p)
}

%body (t: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %t = (s32[], f32[8,8]{1,0:T(8,128)}) parameter(0)
  %x = f32[8,8]{1,0:T(8,128)} get-tuple-element(%t), index=1
  %f = f32[8,8]{1,0:T(8,128)} fusion(%x), kind=kLoop, calls=%fused, metadata={op_name="jit(f)/liere_expm/neg"}
  %cp = f32[8,8]{0,1:T(8,128)} copy(%f)
  %i = s32[] get-tuple-element(%t), index=0
  ROOT %r = (s32[], f32[8,8]{1,0:T(8,128)}) tuple(%i, %cp)
}

%cond (c: (s32[], f32[8,8])) -> pred[] {
  %c = (s32[], f32[8,8]{1,0}) parameter(0)
  ROOT %k = pred[] constant(true)
}

ENTRY %main (a: f32[8,8], b: bf16[4,256]) -> f32[8,8] {
  %a = f32[8,8]{1,0:T(8,128)} parameter(0)
  %b = bf16[4,256]{1,0} parameter(1)
  %z = s32[] constant(0)
  %c0 = bf16[4,256]{1,0} copy(%b), metadata={op_name="jit(f)/pe_rotate/copy"}
  %t0 = (s32[], f32[8,8]{1,0:T(8,128)}) tuple(%z, %a)
  %w = (s32[], f32[8,8]{1,0:T(8,128)}) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  ROOT %o = f32[8,8]{1,0:T(8,128)} get-tuple-element(%w), index=1
}
"""


def test_traffic_counts_top_level_instructions_times_their_loops_and_tiles_as_laid_out():
  """hlo_traffic on a handwritten module: what it counts, how often, in which scope."""
  rows = {r['name']: r for r in hlo_traffic(HLO)}
  assert set(rows) == {'f', 'cp', 'c0'}  # Not the fused negate, parameters, tuples, the loop.
  f, c0 = rows['f'], rows['c0']
  # A copy the compiler added (no op name) counts as the op it copies.
  assert rows['cp']['op_name'] == '(copy of) jit(f)/liere_expm/neg'
  assert (rows['cp']['scope'], rows['cp']['count']) == ('exponential', 5)
  assert (f['scope'], f['count'], c0['scope'], c0['count']) == (
      'exponential', 5, 'rotation application', 1)
  assert f['bytes'] == 5 * 2 * 8 * 8 * 4  # Read and written, 5 trips.
  assert f['padded_bytes'] == 5 * 2 * 8 * 128 * 4  # An 8 x 8 block in an 8 x 128 tile.
  assert c0['bytes'] == c0['padded_bytes'] == 2 * 4 * 256 * 2


def test_a_pallas_kernel_s_cost_estimate_is_read_from_its_custom_call_and_split_by_its_cost():
  """A Mosaic custom call's CostEstimate (in its backend config) is read once a call, its loop's
  trips in 'count'; bench compile's kernel_work multiplies them and splits the FLOPs into MXU
  and vector work by the Cost the kernel declared when traced (kernels.common.DECLARED), and
  one it did not trace keeps them unsplit."""
  from liere_jax.bench.compile import kernel_work
  from liere_jax.kernels.common import Cost, estimate
  def call(name, flops, transcendentals, nbytes):
    return (f'  %{name} = f32[8,8]{{1,0:T(8,128)}} custom-call(%x), custom_call_target='
            f'"tpu_custom_call", metadata={{op_name="jit(f)/{name}/pallas_call"}}, backend_config='
            f'{{"custom_call_config":{{"body":"TUzvUg","cost_estimate":{{"flops":"{flops}",'
            f'"transcendentals":"{transcendentals}","bytes_accessed":"{nbytes}",'
            '"remote_bytes_transferred":"0"}}}\n')
  declared = estimate('attention_forward', Cost(1000, 234, 5, 4096))
  hlo = HLO.replace('  %cp = ', call('attention_forward.3', declared.flops,
                                     declared.transcendentals, declared.bytes_accessed)
                    + '  %cp = ')
  hlo = hlo.replace('  %c0 = ', call('other_kernel', 7, 0, 64) + '  %c0 = ')
  rows = {r['name']: r for r in hlo_traffic(hlo)}
  assert rows['attention_forward.3']['count'] == 5
  assert rows['attention_forward.3']['cost_estimate'] == {
      'flops': 1234, 'transcendentals': 5, 'bytes_accessed': 4096, 'remote_bytes_transferred': 0}
  work = kernel_work(list(rows.values()))
  assert work['attention_forward'] == {'calls': 5, 'mxu_flops': 5000, 'vpu_ops': 1170,
                                       'unsplit_flops': 0, 'transcendentals': 25, 'bytes': 20480}
  assert work['other_kernel'] == {'calls': 1, 'mxu_flops': 0, 'vpu_ops': 0, 'unsplit_flops': 7,
                                  'transcendentals': 0, 'bytes': 64}
