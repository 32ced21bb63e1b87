//! [`Elems`]: tensors' values packed into one contiguous buffer of an
//! element type MPI knows, and back. bf16 and f16 travel as f32 (MPI has
//! no such types; a sum of them rounds once, at the end), bool as u8, the
//! narrow integers in their compute dtype (i8, u8, i16, u16 as i32; u32 as
//! i64: a wrapping sum wrapped back once equals one wrapped per step) and
//! u64 as i64's same bits (sums wrap alike; max and min would compare it
//! signed, so `collectives::check_dtype` refuses them).

use tracejit_tensor::{bf16, f16, DType, Storage};

/// A contiguous buffer of one MPI element type.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Elems {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
}

/// The transport element type of a tensor dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    F32,
    F64,
    I32,
    I64,
    U8,
}

impl Kind {
    /// How `dtype` travels.
    pub(crate) fn of(dtype: DType) -> Kind {
        match dtype {
            DType::F32 | DType::BF16 | DType::F16 => Kind::F32,
            DType::F64 => Kind::F64,
            DType::I32 | DType::I8 | DType::U8 | DType::I16 | DType::U16 => Kind::I32,
            DType::I64 | DType::U32 | DType::U64 => Kind::I64,
            DType::Bool => Kind::U8,
        }
    }

    /// Bytes per element.
    pub(crate) fn size(self) -> usize {
        match self {
            Kind::F32 | Kind::I32 => 4,
            Kind::F64 | Kind::I64 => 8,
            Kind::U8 => 1,
        }
    }
}

impl Elems {
    /// An empty buffer of `kind` with room for `n` elements.
    pub(crate) fn with_capacity(kind: Kind, n: usize) -> Elems {
        match kind {
            Kind::F32 => Elems::F32(Vec::with_capacity(n)),
            Kind::F64 => Elems::F64(Vec::with_capacity(n)),
            Kind::I32 => Elems::I32(Vec::with_capacity(n)),
            Kind::I64 => Elems::I64(Vec::with_capacity(n)),
            Kind::U8 => Elems::U8(Vec::with_capacity(n)),
        }
    }

    /// `n` zeros of `kind` (a receive buffer).
    #[cfg_attr(not(feature = "mpi"), expect(dead_code, reason = "only MPI receives into a buffer"))]
    pub(crate) fn zeros(kind: Kind, n: usize) -> Elems {
        match kind {
            Kind::F32 => Elems::F32(vec![0.0; n]),
            Kind::F64 => Elems::F64(vec![0.0; n]),
            Kind::I32 => Elems::I32(vec![0; n]),
            Kind::I64 => Elems::I64(vec![0; n]),
            Kind::U8 => Elems::U8(vec![0; n]),
        }
    }

    /// The values of `storages` one after another (each in row-major
    /// order); every storage must travel as the same kind.
    pub(crate) fn pack(storages: &[&Storage]) -> Elems {
        let kind = storages.first().map_or(Kind::F32, |s| Kind::of(s.dtype()));
        let mut out = Elems::with_capacity(kind, storages.iter().map(|s| s.len()).sum());
        for s in storages {
            out.append(s);
        }
        out
    }

    fn append(&mut self, s: &Storage) {
        let kind = self.kind();
        let wrong = || panic!("tracejit-distributed: a {:?} tensor packed into a {kind:?} buffer", s.dtype());
        match (&mut *self, s) {
            // Contiguous f32/f64 (gradients almost always are): one memcpy.
            (Elems::F32(v), Storage::F32(a)) if a.as_slice().is_some() => {
                v.extend_from_slice(a.as_slice().unwrap_or(&[]))
            }
            (Elems::F64(v), Storage::F64(a)) if a.as_slice().is_some() => {
                v.extend_from_slice(a.as_slice().unwrap_or(&[]))
            }
            (Elems::F32(v), Storage::F32(a)) => v.extend(a.iter()),
            (Elems::F32(v), Storage::BF16(a)) => v.extend(a.iter().map(|x| x.to_f32())),
            (Elems::F32(v), Storage::F16(a)) => v.extend(a.iter().map(|x| x.to_f32())),
            (Elems::F64(v), Storage::F64(a)) => v.extend(a.iter()),
            (Elems::I32(v), Storage::I32(a)) => v.extend(a.iter()),
            (Elems::I64(v), Storage::I64(a)) => v.extend(a.iter()),
            (Elems::I32(v), Storage::I8(a)) => v.extend(a.iter().map(|&x| i32::from(x))),
            (Elems::I32(v), Storage::U8(a)) => v.extend(a.iter().map(|&x| i32::from(x))),
            (Elems::I32(v), Storage::I16(a)) => v.extend(a.iter().map(|&x| i32::from(x))),
            (Elems::I32(v), Storage::U16(a)) => v.extend(a.iter().map(|&x| i32::from(x))),
            (Elems::I64(v), Storage::U32(a)) => v.extend(a.iter().map(|&x| i64::from(x))),
            (Elems::I64(v), Storage::U64(a)) => v.extend(a.iter().map(|&x| x as i64)),
            (Elems::U8(v), Storage::Bool(a)) => v.extend(a.iter().map(|&b| u8::from(b))),
            _ => wrong(),
        }
    }

    /// The element type.
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Elems::F32(_) => Kind::F32,
            Elems::F64(_) => Kind::F64,
            Elems::I32(_) => Kind::I32,
            Elems::I64(_) => Kind::I64,
            Elems::U8(_) => Kind::U8,
        }
    }

    /// Number of elements.
    #[cfg_attr(not(any(feature = "mpi", test)), expect(dead_code, reason = "MPI's counts and tests"))]
    pub(crate) fn len(&self) -> usize {
        match self {
            Elems::F32(v) => v.len(),
            Elems::F64(v) => v.len(),
            Elems::I32(v) => v.len(),
            Elems::I64(v) => v.len(),
            Elems::U8(v) => v.len(),
        }
    }

    /// The buffer's first element, for MPI (valid while `self` lives and
    /// is not resized).
    #[cfg_attr(not(feature = "mpi"), expect(dead_code, reason = "only the MPI transport hands out pointers"))]
    pub(crate) fn as_mut_ptr(&mut self) -> *mut std::ffi::c_void {
        match self {
            Elems::F32(v) => v.as_mut_ptr().cast(),
            Elems::F64(v) => v.as_mut_ptr().cast(),
            Elems::I32(v) => v.as_mut_ptr().cast(),
            Elems::I64(v) => v.as_mut_ptr().cast(),
            Elems::U8(v) => v.as_mut_ptr().cast(),
        }
    }

    /// Divides every element by `n` (a mean from a sum); floats only.
    pub(crate) fn divide(&mut self, n: usize) {
        match self {
            Elems::F32(v) => v.iter_mut().for_each(|x| *x /= n as f32),
            Elems::F64(v) => v.iter_mut().for_each(|x| *x /= n as f64),
            _ => panic!("tracejit-distributed: a mean of {:?} elements", self.kind()),
        }
    }

    /// Cuts the buffer into tensors of the given dtypes and shapes, in
    /// order, starting at element `offset` (casting back what traveled as
    /// another type).
    pub(crate) fn unpack(&self, offset: usize, types: &[(DType, Vec<usize>)]) -> Vec<Storage> {
        let mut at = offset;
        types
            .iter()
            .map(|(dtype, shape)| {
                let n: usize = shape.iter().product();
                let s = self.storage(at, n, *dtype, shape);
                at += n;
                s
            })
            .collect()
    }

    fn storage(&self, at: usize, n: usize, dtype: DType, shape: &[usize]) -> Storage {
        let r = at..at + n;
        let s = match (self, dtype) {
            (Elems::F32(v), DType::F32) => Storage::from_vec(v[r].to_vec(), shape),
            (Elems::F32(v), DType::BF16) => Storage::from_vec(v[r].iter().map(|&x| bf16::from_f32(x)).collect(), shape),
            (Elems::F32(v), DType::F16) => Storage::from_vec(v[r].iter().map(|&x| f16::from_f32(x)).collect(), shape),
            (Elems::F64(v), DType::F64) => Storage::from_vec(v[r].to_vec(), shape),
            (Elems::I32(v), DType::I32) => Storage::from_vec(v[r].to_vec(), shape),
            (Elems::I64(v), DType::I64) => Storage::from_vec(v[r].to_vec(), shape),
            // Wrapped back to the storage width (`as` keeps the low bits).
            (Elems::I32(v), DType::I8) => Storage::from_vec(v[r].iter().map(|&x| x as i8).collect(), shape),
            (Elems::I32(v), DType::U8) => Storage::from_vec(v[r].iter().map(|&x| x as u8).collect(), shape),
            (Elems::I32(v), DType::I16) => Storage::from_vec(v[r].iter().map(|&x| x as i16).collect(), shape),
            (Elems::I32(v), DType::U16) => Storage::from_vec(v[r].iter().map(|&x| x as u16).collect(), shape),
            (Elems::I64(v), DType::U32) => Storage::from_vec(v[r].iter().map(|&x| x as u32).collect(), shape),
            (Elems::I64(v), DType::U64) => Storage::from_vec(v[r].iter().map(|&x| x as u64).collect(), shape),
            (Elems::U8(v), DType::Bool) => Storage::from_vec(v[r].iter().map(|&b| b != 0).collect(), shape),
            _ => panic!("tracejit-distributed: a {:?} buffer unpacked as {dtype:?}", self.kind()),
        };
        s.expect("the element count matches the shape by construction")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_then_unpack_is_the_identity_for_every_dtype() {
        let cases = [
            Storage::from_vec(vec![1.5f32, -0.0, f32::NAN, f32::INFINITY], &[2, 2]).unwrap(),
            Storage::from_vec(vec![bf16::from_f32(3.0), bf16::from_f32(-1e-3)], &[2]).unwrap(),
            Storage::from_vec(vec![f16::from_f32(65504.0)], &[1]).unwrap(),
            Storage::from_vec(vec![1e300f64, -2.0, 3.0], &[3]).unwrap(),
            Storage::from_vec(vec![i32::MIN, 7], &[1, 2]).unwrap(),
            Storage::from_vec(vec![i64::MAX], &[]).unwrap(),
            Storage::from_vec(vec![true, false, true], &[3]).unwrap(),
            Storage::from_vec(vec![i8::MIN, -1, i8::MAX], &[3]).unwrap(),
            Storage::from_vec(vec![0u8, 255], &[2]).unwrap(),
            Storage::from_vec(vec![i16::MIN, i16::MAX], &[2]).unwrap(),
            Storage::from_vec(vec![u16::MAX], &[1]).unwrap(),
            Storage::from_vec(vec![u32::MAX, 1], &[2]).unwrap(),
            Storage::from_vec(vec![u64::MAX, 1 << 63], &[2]).unwrap(),
        ];
        for s in &cases {
            let packed = Elems::pack(&[s, s]);
            assert_eq!(packed.len(), 2 * s.len());
            let t = (s.dtype(), s.shape().to_vec());
            let back = packed.unpack(0, &[t.clone(), t]);
            assert!(back.iter().all(|b| b.bit_eq(s)), "{s:?} -> {back:?}");
        }
    }

    #[test]
    fn divide_makes_a_mean_and_refuses_integers() {
        let mut e = Elems::F64(vec![3.0, -1.0]);
        e.divide(2);
        assert_eq!(e, Elems::F64(vec![1.5, -0.5]));
        let r = std::panic::catch_unwind(|| Elems::I32(vec![4]).divide(2));
        assert!(r.is_err());
    }
}
