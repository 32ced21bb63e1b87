//! The panel: a band's input rows, copied so that a run of adjacent output
//! pixels reads adjacent values at every tap. Shared by the direct forward
//! kernel ([`super::engine`]) and the backward-filter kernels
//! ([`super::filter`], [`super::filter_px`]); written by the vector code
//! (`tiles::pack`), a masked vector at a time.
//!
//! For a band of `rows` output rows from `oh0`, the panel holds, per input
//! channel, the `rows_in = (rows - 1)·sh + (kh - 1)·dh + 1` input rows
//! those read (rows outside the input as zeros), each split into `sw`
//! phase rows of `q` values: phase `p` of a row holds its padded columns
//! `p, p + sw, p + 2·sw, …` (zeros where they fall in the padding or past
//! the input). Output pixel `(oh0 + r, ow)` at tap `(kh, ic, kw)` then
//! reads `panel[offset(kh, ic, kw) + r·row_step + ow]`.

use super::engine::Shape;

/// The layout of a band's panel for a [`Shape`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Panel {
    /// Output rows per band.
    pub rows: usize,
    /// Input rows per band.
    pub rows_in: usize,
    /// Values per phase row (at least the output width plus the widest
    /// tap's offset, plus whatever a kernel reads past the last pixel).
    pub q: usize,
}

impl Panel {
    /// The panel of bands of `rows` output rows, phase rows of `q` values.
    ///
    /// # Panics
    /// If a panel's offsets would not fit in `u32`.
    pub fn new(s: &Shape, rows: usize, q: usize) -> Panel {
        let rows_in = (rows.max(1) - 1) * s.stride[0] + (s.kernel[0] - 1) * s.dilation[0] + 1;
        let p = Panel { rows, rows_in, q };
        assert!(
            p.len(s) < u32::MAX as usize,
            "conv: a band of input rows ({} channels × {rows_in} rows × {} values) is too large",
            s.in_c,
            s.stride[1] * q
        );
        p
    }

    /// The least `q` for output pixels `0..width` (more for kernels that
    /// read whole vectors past the last pixel).
    pub fn least_q(s: &Shape, width: usize) -> usize {
        width + (s.kernel[1] - 1) * s.dilation[1] / s.stride[1]
    }

    /// Bytes of the panel of `rows` rows at `q` (for choosing `rows`).
    pub fn bytes(s: &Shape, rows: usize, q: usize) -> usize {
        let rows_in = (rows.max(1) - 1) * s.stride[0] + (s.kernel[0] - 1) * s.dilation[0] + 1;
        s.in_c * rows_in * s.stride[1] * q * 4
    }

    /// Values of the panel.
    pub fn len(&self, s: &Shape) -> usize {
        s.in_c * self.rows_in * s.stride[1] * self.q
    }

    /// Panel values between two output rows' starts.
    pub fn row_step(&self, s: &Shape) -> usize {
        s.stride[0] * s.stride[1] * self.q
    }

    /// Where output pixel `(0, 0)` of the band reads tap `(kh, ic, kw)`.
    pub fn offset(&self, s: &Shape, kh: usize, ic: usize, kw: usize) -> usize {
        let ([sw, dw], dh) = ([s.stride[1], s.dilation[1]], s.dilation[0]);
        ((ic * self.rows_in + kh * dh) * sw + kw * dw % sw) * self.q + kw * dw / sw
    }

    /// Fills `panel` with the band starting at output row `oh0`, `x` being
    /// the group's input planes of one image; `R` writes the rows.
    ///
    /// # Safety
    /// Whatever `R` needs (the vector writers: their CPU features).
    #[inline(always)]
    pub unsafe fn pack_with<R: RowWriter>(&self, s: &Shape, x: &[f32], oh0: usize, panel: &mut [f32]) {
        let [ih_n, iw_n] = s.in_hw;
        let sw = s.stride[1];
        let row_len = sw * self.q;
        // Per phase p: dst[j] = src[j·sw + off] inside the row for j in
        // first..end (the same for every row).
        let mut runs = [(0isize, 0usize, 0usize); 8];
        let mut runs_vec = Vec::new();
        let runs: &mut [(isize, usize, usize)] = if sw <= 8 {
            &mut runs[..sw]
        } else {
            runs_vec.resize(sw, (0, 0, 0));
            &mut runs_vec
        };
        for (phase, run) in runs.iter_mut().enumerate() {
            let off = phase as isize - s.pad[1];
            let first = if off >= 0 { 0 } else { ((-off) as usize).div_ceil(sw) };
            let end = if off >= iw_n as isize { 0 } else { ((iw_n as isize - off) as usize).div_ceil(sw) };
            let first = first.min(self.q);
            *run = (off, first, end.clamp(first, self.q));
        }
        for ic in 0..s.in_c {
            let plane = &x[ic * ih_n * iw_n..][..ih_n * iw_n];
            for li in 0..self.rows_in {
                let dst = &mut panel[(ic * self.rows_in + li) * row_len..][..row_len];
                let ih = (oh0 * s.stride[0]) as isize - s.pad[0] + li as isize;
                if ih < 0 || ih >= ih_n as isize {
                    // SAFETY: forwarded from the caller.
                    unsafe { R::row(dst, 0, 0, &[]) };
                    continue;
                }
                let src = &plane[ih as usize * iw_n..][..iw_n];
                for (&(off, first, end), dst) in runs.iter().zip(dst.chunks_exact_mut(self.q)) {
                    if sw == 1 {
                        let start = (first as isize + off) as usize;
                        // SAFETY: forwarded from the caller.
                        unsafe { R::row(dst, first, end, &src[start..start + end - first]) };
                    } else {
                        dst[..first].fill(0.0);
                        dst[end..].fill(0.0);
                        for (j, v) in (first..end).zip(&mut dst[first..end]) {
                            *v = src[(j as isize * sw as isize + off) as usize];
                        }
                    }
                }
            }
        }
    }
}

/// Writes one phase row of a panel: `dst[..first]` and `dst[end..]` zero,
/// `dst[first..end]` copied from `src` (`end - first` values).
pub(super) trait RowWriter {
    /// See the trait.
    ///
    /// # Safety
    /// The implementation's (vector writers: their CPU features).
    unsafe fn row(dst: &mut [f32], first: usize, end: usize, src: &[f32]);
}

thread_local! {
    /// Each thread's panel (and the filter kernel's transposed `dy`), grown
    /// to the largest and kept.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's scratch of at least `len` values.
pub(super) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|cell| {
        let mut v = cell.borrow_mut();
        if v.len() < len {
            v.resize(len, 0.0);
        }
        f(&mut v[..len])
    })
}
