//! Parsing the spatial ops (`conv2d[stride=[1, 1], dilation=[1, 1],
//! pads=[0, 0, 0, 0], groups=1, bias=true, relu=false]`, `max_pool2d[kernel=[2,
//! 2], stride=[2, 2], pads=[0, 0, 0, 0]]`, ...): the inverse of
//! `printer::spatial_attrs`.

use tracejit_tensor::{Conv2dAttrs, Pool2dAttrs, SpatialOp};

use super::cursor::Cursor;
use super::ParseError;

/// The spatial op `name` with its attributes, or `None` for another name.
pub(super) fn spatial_op(name: &str, c: &mut Cursor<'_>) -> Result<Option<SpatialOp>, ParseError> {
    if !SpatialOp::NAMES.contains(&name) {
        return Ok(None);
    }
    c.expect("[")?;
    let op = match name {
        "conv2d" => {
            let conv = conv_attrs(c)?;
            let bias = flag(c, "bias")?;
            let relu = flag(c, "relu")?;
            SpatialOp::Conv2d { conv, bias, relu }
        }
        "conv2d_nhwc" => {
            let conv = conv_attrs(c)?;
            let [scale, bias, residual, relu] = epilogue_flags(c)?;
            SpatialOp::Conv2dNhwc { conv, scale, bias, residual, relu }
        }
        "conv2d_backward_data" => {
            let conv = conv_attrs(c)?;
            let input_hw = pair(c, "input_hw")?;
            SpatialOp::Conv2dBackwardData { conv, input_hw }
        }
        "conv2d_backward_filter" => {
            let conv = conv_attrs(c)?;
            let kernel = pair(c, "kernel")?;
            let bias = flag(c, "bias")?;
            SpatialOp::Conv2dBackwardFilter { conv, kernel, bias }
        }
        "max_pool2d" => SpatialOp::MaxPool2d { pool: pool_attrs(c)? },
        "max_pool2d_nhwc" => SpatialOp::MaxPool2dNhwc { pool: pool_attrs(c)? },
        "max_pool2d_backward" => SpatialOp::MaxPool2dBackward { pool: pool_attrs(c)? },
        "avg_pool2d" => SpatialOp::AvgPool2d { pool: pool_attrs(c)? },
        _ => {
            let pool = pool_attrs(c)?;
            let input_hw = pair(c, "input_hw")?;
            SpatialOp::AvgPool2dBackward { pool, input_hw }
        }
    };
    c.expect("]")?;
    Ok(Some(op))
}

/// `stride=[a, b], dilation=[a, b], pads=[t, l, b, r], groups=g`.
fn conv_attrs(c: &mut Cursor<'_>) -> Result<Conv2dAttrs, ParseError> {
    c.key("stride")?;
    let stride = sizes::<2>(c)?;
    c.expect(",")?;
    c.key("dilation")?;
    let dilation = sizes::<2>(c)?;
    c.expect(",")?;
    c.key("pads")?;
    let pad = sizes::<4>(c)?;
    c.expect(",")?;
    c.key("groups")?;
    let groups = c.number("a group count")?;
    Ok(Conv2dAttrs { stride, dilation, pad, groups })
}

/// `kernel=[a, b], stride=[a, b], pads=[t, l, b, r]`.
fn pool_attrs(c: &mut Cursor<'_>) -> Result<Pool2dAttrs, ParseError> {
    c.key("kernel")?;
    let kernel = sizes::<2>(c)?;
    c.expect(",")?;
    c.key("stride")?;
    let stride = sizes::<2>(c)?;
    c.expect(",")?;
    c.key("pads")?;
    let pad = sizes::<4>(c)?;
    Ok(Pool2dAttrs { kernel, stride, pad })
}

/// `, key=[a, b]`.
fn pair(c: &mut Cursor<'_>, key: &str) -> Result<[usize; 2], ParseError> {
    c.expect(",")?;
    c.key(key)?;
    sizes::<2>(c)
}

/// A `conv2d_nhwc`'s `, scale=.., bias=.., residual=.., relu=..` in that
/// order, `scale` and `residual` optional (false when left out, as the
/// printer leaves them out).
fn epilogue_flags(c: &mut Cursor<'_>) -> Result<[bool; 4], ParseError> {
    const NAMES: [&str; 4] = ["scale", "bias", "residual", "relu"];
    let mut flags = [None; 4];
    let mut next = 0;
    while c.eat(",") {
        let key = c.word("a flag")?;
        let Some(i) = NAMES[next..].iter().position(|&n| n == key).map(|p| p + next) else {
            return Err(c.invalid(format!("expected one of {:?} (in that order), got `{key}`", &NAMES[next..])));
        };
        c.expect("=")?;
        flags[i] = Some(c.number("`true` or `false`")?);
        next = i + 1;
    }
    for i in [1, 3] {
        if flags[i].is_none() {
            return Err(c.invalid(format!("`{}=` is missing", NAMES[i])));
        }
    }
    Ok(flags.map(|f| f.unwrap_or(false)))
}

/// `, key=true` or `, key=false`.
fn flag(c: &mut Cursor<'_>, key: &str) -> Result<bool, ParseError> {
    c.expect(",")?;
    c.key(key)?;
    c.number("`true` or `false`")
}

/// `[a, b, ..]` of exactly `N` sizes.
fn sizes<const N: usize>(c: &mut Cursor<'_>) -> Result<[usize; N], ParseError> {
    let v: Vec<usize> = c.list("[", "]", |c| c.number("a non-negative integer"))?;
    v.try_into().map_err(|v: Vec<usize>| c.invalid(format!("expected {N} sizes, got {}", v.len())))
}
