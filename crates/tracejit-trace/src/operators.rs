//! `+ - * /` and unary `-` for `Tensor` and `&Tensor`, with scalars on either
//! side. On the right a scalar may be any [`Scalar`] (f32, f64, i32, i64);
//! on the left only f64 and i32 have impls, because two float impls would make
//! `0.5 * x` ambiguous (E0282). Either way the scalar takes the tensor's dtype.

use std::ops::{Add, Div, Mul, Neg, Sub};

use crate::ops::Scalar;
use crate::Tensor;

macro_rules! binary_operator {
    ($trait:ident, $method:ident) => {
        impl $trait<Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                Tensor::$method(&self, &rhs)
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                Tensor::$method(&self, rhs)
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                Tensor::$method(self, &rhs)
            }
        }
        impl $trait<&Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                Tensor::$method(self, rhs)
            }
        }
        impl<S: Scalar> $trait<S> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: S) -> Tensor {
                Tensor::$method(&self, rhs)
            }
        }
        impl<S: Scalar> $trait<S> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: S) -> Tensor {
                Tensor::$method(self, rhs)
            }
        }
        binary_operator!(@left $trait, $method, f64);
        binary_operator!(@left $trait, $method, i32);
    };
    (@left $trait:ident, $method:ident, $t:ty) => {
        impl $trait<Tensor> for $t {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                let lhs = crate::ops::Operand::into_tensor(self, &rhs, stringify!($method));
                Tensor::$method(&lhs, &rhs)
            }
        }
        impl $trait<&Tensor> for $t {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                let lhs = crate::ops::Operand::into_tensor(self, rhs, stringify!($method));
                Tensor::$method(&lhs, rhs)
            }
        }
    };
}

binary_operator!(Add, add);
binary_operator!(Sub, sub);
binary_operator!(Mul, mul);
binary_operator!(Div, div);

impl Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(&self)
    }
}

impl Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(self)
    }
}
