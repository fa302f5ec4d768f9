"""Device function shared by the forward kernels: one row's block statistics folded into its
running statistics (:class:`fusedce.stats.RowStats`)."""
import triton
import triton.language as tl


@triton.jit
def fold_into_row(max_ptr, sumexp_ptr, target_logit_ptr, logit_sum_ptr, row, m, s, z_target, z_sum,
                  NEED_SUM: tl.constexpr):
    """Merge a block's (max ``m``, Σ exp(c − m) ``s``) into the row's stored (max, sumexp):
    M = max(m_old, m), S = s_old·exp(m_old − M) + s·exp(m − M); add the block's c_y (and Σ c)."""
    m_old = tl.load(max_ptr + row)
    s_old = tl.load(sumexp_ptr + row)
    m_all = tl.maximum(m_old, m)
    tl.store(sumexp_ptr + row, s_old * tl.exp(m_old - m_all) + s * tl.exp(m - m_all))
    tl.store(max_ptr + row, m_all)
    tl.store(target_logit_ptr + row, tl.load(target_logit_ptr + row) + z_target)
    if NEED_SUM:
        tl.store(logit_sum_ptr + row, tl.load(logit_sum_ptr + row) + z_sum)
