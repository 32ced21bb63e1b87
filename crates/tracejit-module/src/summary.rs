//! [`Summary`]: a table of a module and its submodules with their type,
//! parameter count and bytes, printed by `Display`.
//!
//! Each row counts the distinct variables (by id) below its module, so a
//! variable shared by two submodules counts once in their common ancestors
//! and once in each of them; the totals count every distinct variable once.

use std::collections::HashSet;
use std::fmt;

use crate::inventory::Inventory;
use crate::Module;

/// One module in a [`Summary`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SummaryRow {
    /// The module's path (`""` for the root, printed as `(root)`).
    pub path: String,
    /// Its name scope (`mlp/dense_1`).
    pub scope: String,
    /// Its type name (`Dense`).
    pub type_name: &'static str,
    /// Nesting depth (0 for the root).
    pub depth: usize,
    /// Number of elements of the distinct variables below it.
    pub parameters: usize,
    /// Bytes of those elements (a bool takes one byte).
    pub bytes: usize,
}

/// A table of a module and its submodules, depth first; see
/// [`Module::summary`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// The root first, then every submodule once per path.
    pub rows: Vec<SummaryRow>,
    /// Elements of all distinct variables.
    pub total_parameters: usize,
    /// Elements of the distinct trainable variables.
    pub trainable_parameters: usize,
    /// Bytes of all distinct variables.
    pub total_bytes: usize,
}

impl Summary {
    pub(crate) fn of<M: Module + ?Sized>(module: &M) -> Summary {
        let inv = Inventory::of(module);
        let mut rows: Vec<SummaryRow> = inv
            .modules
            .iter()
            .map(|m| SummaryRow {
                path: m.path.clone(),
                scope: m.scope.clone(),
                type_name: m.type_name,
                depth: m.depth,
                parameters: 0,
                bytes: 0,
            })
            .collect();
        let mut seen: Vec<HashSet<u64>> = vec![HashSet::new(); rows.len()];
        let (mut total_parameters, mut trainable_parameters, mut total_bytes) = (0, 0, 0);
        for v in &inv.variables {
            let elements: usize = v.variable.shape().iter().product();
            let bytes = elements * v.variable.dtype().size_of();
            for &owner in &v.owners {
                if seen[owner].insert(v.variable.id()) {
                    rows[owner].parameters += elements;
                    rows[owner].bytes += bytes;
                }
            }
        }
        for v in inv.distinct_variables() {
            let elements: usize = v.variable.shape().iter().product();
            total_parameters += elements;
            total_bytes += elements * v.variable.dtype().size_of();
            if v.variable.trainable() {
                trainable_parameters += elements;
            }
        }
        Summary { rows, total_parameters, trainable_parameters, total_bytes }
    }
}

impl fmt::Display for Summary {
    /// An aligned table (path indented by depth, name scope, type, params,
    /// bytes) and a totals line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header = ["path", "name", "type", "params", "bytes"];
        let cells: Vec<[String; 5]> = self
            .rows
            .iter()
            .map(|r| {
                let path = if r.path.is_empty() { "(root)".to_string() } else { r.path.clone() };
                [
                    format!("{}{path}", "  ".repeat(r.depth)),
                    r.scope.clone(),
                    r.type_name.to_string(),
                    r.parameters.to_string(),
                    r.bytes.to_string(),
                ]
            })
            .collect();
        let mut width = header.map(str::len);
        for row in &cells {
            for (w, c) in width.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |f: &mut fmt::Formatter<'_>, row: [&str; 5]| -> fmt::Result {
            writeln!(
                f,
                "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {:>w4$}",
                row[0],
                row[1],
                row[2],
                row[3],
                row[4],
                w0 = width[0],
                w1 = width[1],
                w2 = width[2],
                w3 = width[3],
                w4 = width[4]
            )
        };
        line(f, header)?;
        for row in &cells {
            line(f, [&row[0], &row[1], &row[2], &row[3], &row[4]])?;
        }
        write!(
            f,
            "total: {} parameters ({} trainable), {} bytes",
            self.total_parameters, self.trainable_parameters, self.total_bytes
        )
    }
}
