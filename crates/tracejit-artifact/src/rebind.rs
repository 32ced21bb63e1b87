//! Variables across the text form. A graph's text names its variables but
//! holds no values, and every graph of a program (the top graph, branch and
//! loop bodies, library functions) declares the variables it uses itself.
//! So an artifact gives each distinct variable a unique path before the
//! graph is printed ([`name_for_save`]), and on load binds every graph's
//! declaration of a path to the one live [`Variable`] restored for it
//! ([`bind`]): a variable shared by a loop body and the top graph stays
//! one variable.

use std::collections::HashMap;
use std::sync::Arc;

use tracejit_ir::tensor::{DType, Storage};
use tracejit_ir::{Graph, VariableResource};
use tracejit_trace::Variable;

/// `f` on `g` and on every graph nested in it, depth first.
pub(crate) fn for_each_graph(g: &mut Graph, f: &mut dyn FnMut(&mut Graph) -> Result<(), String>) -> Result<(), String> {
    f(g)?;
    let ids: Vec<_> = g.nodes().map(|(id, _)| id).collect();
    for id in ids {
        for sub in g.node_mut(id).op.subgraphs_mut() {
            for_each_graph(Arc::make_mut(sub), f)?;
        }
    }
    for (_, func) in g.library.iter_mut() {
        for_each_graph(Arc::make_mut(&mut func.graph), f)?;
    }
    Ok(())
}

/// A variable shown under another name (its path in the artifact); every
/// other method is the variable's own.
#[derive(Debug)]
struct Renamed {
    inner: Arc<dyn VariableResource>,
    path: String,
}

impl VariableResource for Renamed {
    fn name(&self) -> String {
        self.path.clone()
    }
    fn dtype(&self) -> DType {
        self.inner.dtype()
    }
    fn shape(&self) -> Vec<usize> {
        self.inner.shape()
    }
    fn read(&self) -> Storage {
        self.inner.read()
    }
    fn write(&self, value: Storage) {
        self.inner.write(value)
    }
    fn id(&self) -> u64 {
        self.inner.id()
    }
}

/// Variables by path, in order of first declaration.
pub(crate) type NamedVariables = Vec<(String, Arc<dyn VariableResource>)>;

/// `g` with every variable renamed to a unique path (its name, with `#2`,
/// `#3`... for later distinct variables of the same name), and the
/// variables by path in order of first declaration.
pub(crate) fn name_for_save(g: &Graph) -> (Graph, NamedVariables) {
    let mut g = g.clone();
    let mut by_id: HashMap<u64, String> = HashMap::new();
    let mut order: NamedVariables = Vec::new();
    let mut taken: HashMap<String, usize> = HashMap::new();
    let renamed = for_each_graph(&mut g, &mut |graph| {
        for v in graph.variables.values_mut() {
            let path = match by_id.get(&v.id()) {
                Some(p) => p.clone(),
                None => {
                    let name = v.name();
                    let n = taken.entry(name.clone()).or_insert(0);
                    *n += 1;
                    let path = if *n == 1 { name } else { format!("{name}#{n}") };
                    by_id.insert(v.id(), path.clone());
                    order.push((path.clone(), v.clone()));
                    path
                }
            };
            *v = Arc::new(Renamed { inner: v.clone(), path });
        }
        Ok(())
    });
    renamed.expect("renaming cannot fail");
    (g, order)
}

/// Binds every variable declared in `g` (and its nested graphs) to the
/// variable of its path in `vars`; the error names a declaration without a
/// value or one whose type differs from the value's.
pub(crate) fn bind(g: &mut Graph, vars: &HashMap<String, Variable>) -> Result<(), String> {
    for_each_graph(g, &mut |graph| {
        for v in graph.variables.values_mut() {
            let path = v.name();
            let Some(var) = vars.get(&path) else {
                return Err(format!("the graph declares variable `{path}`, which the artifact holds no value for"));
            };
            if var.dtype() != v.dtype() || var.shape() != v.shape().as_slice() {
                return Err(format!(
                    "variable `{path}` is declared {}{:?} in the graph but its value is {}{:?}",
                    v.dtype(),
                    v.shape(),
                    var.dtype(),
                    var.shape()
                ));
            }
            *v = var.resource();
        }
        Ok(())
    })
}
