//! Module names: snake_case type names and the uniquifying rule of name
//! scopes (`dense`, `dense_1`, `dense_2`).

use std::collections::HashSet;

/// A CamelCase type name in snake_case, as TensorFlow's `camel_to_snake`
/// does: an underscore before an uppercase letter that follows a lowercase
/// letter or a digit, or that starts a word after an acronym; then lowercase.
/// `Mlp` → `mlp`, `DenseLayer` → `dense_layer`, `MLP` → `mlp`,
/// `HTTPServer` → `http_server`, `Conv2D` → `conv2_d`.
pub fn to_snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            if (prev.is_lowercase() || prev.is_ascii_digit() || next_lower) && prev != '_' {
                out.push('_');
            }
        }
        out.extend(c.to_lowercase());
    }
    out
}

/// `base` if unused in `used`, else `base_1`, `base_2`, ... (the first free
/// one); records the result in `used`.
pub(crate) fn uniquify(base: &str, used: &mut HashSet<String>) -> String {
    let mut candidate = base.to_string();
    let mut n = 0;
    while used.contains(&candidate) {
        n += 1;
        candidate = format!("{base}_{n}");
    }
    used.insert(candidate.clone());
    candidate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake_case_follows_tensorflow() {
        for (camel, snake) in [
            ("Mlp", "mlp"),
            ("Dense", "dense"),
            ("DenseLayer", "dense_layer"),
            ("MLP", "mlp"),
            ("HTTPServer", "http_server"),
            ("Conv2D", "conv2_d"),
            ("already_snake", "already_snake"),
            ("Layer_Norm", "layer_norm"),
            ("", ""),
        ] {
            assert_eq!(to_snake_case(camel), snake, "{camel}");
        }
    }

    #[test]
    fn uniquify_counts_from_one() {
        let mut used = HashSet::new();
        assert_eq!(uniquify("dense", &mut used), "dense");
        assert_eq!(uniquify("dense", &mut used), "dense_1");
        used.insert("dense_2".to_string());
        assert_eq!(uniquify("dense", &mut used), "dense_3");
    }
}
