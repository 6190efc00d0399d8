//! What one parse may spend: a job file comes from users who are not root (and, through
//! `/v1/jobs/parse`, from the network), so the values it builds are bounded in depth
//! (the evaluator and our helpers recurse on them) and the work its expressions do is
//! bounded per parse (hcl-rs evaluates `for`s and references by copying values).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use hcl::Value;

use super::{MAX_PARSE_WORK_BYTES, MAX_VALUE_DEPTH, MAX_VARIABLES_BYTES};

thread_local! {
    /// Bytes of work the current parse may still do.
    static WORK_LEFT: Cell<usize> = const { Cell::new(MAX_PARSE_WORK_BYTES) };
    /// The size of every variable and local produced so far (`var.x`, `local.y`).
    static NAMED_SIZES: RefCell<HashMap<String, usize>> = RefCell::new(HashMap::new());
}

/// One parse's budget: set afresh when made, cleared when dropped.
pub(crate) struct ParseBudget(());

impl ParseBudget {
    pub(crate) fn start() -> Self {
        reset();
        ParseBudget(())
    }
}

impl Drop for ParseBudget {
    fn drop(&mut self) {
        reset();
    }
}

fn reset() {
    WORK_LEFT.with(|w| w.set(MAX_PARSE_WORK_BYTES));
    NAMED_SIZES.with(|n| n.borrow_mut().clear());
}

/// The error when the work budget is spent.
pub(crate) fn work_error() -> String {
    format!("the job file's expressions need more than {MAX_PARSE_WORK_BYTES} bytes of work")
}

/// Bytes of work left.
pub(crate) fn left() -> usize {
    WORK_LEFT.with(Cell::get)
}

/// Spend `bytes` of work, or fail when less is left.
pub(crate) fn charge(bytes: usize) -> Result<(), String> {
    WORK_LEFT.with(|w| match w.get().checked_sub(bytes) {
        Some(rest) => {
            w.set(rest);
            Ok(())
        }
        None => {
            w.set(0);
            Err(work_error())
        }
    })
}

/// Record the size of `root.name` (a variable or local just produced); fails when all
/// of them together would exceed [`MAX_VARIABLES_BYTES`].
pub(crate) fn record_named(root: &str, name: &str, size: usize) -> Result<(), String> {
    NAMED_SIZES.with(|n| {
        let mut n = n.borrow_mut();
        let total: usize = n.values().sum::<usize>().saturating_add(size);
        if total > MAX_VARIABLES_BYTES {
            return Err(format!(
                "the job file's variables and locals together are larger than {MAX_VARIABLES_BYTES} bytes"
            ));
        }
        n.insert(format!("{root}.{name}"), size);
        Ok(())
    })
}

/// The size of `root.name`, or of all of `root` when `name` is `None` (an index by an
/// expression: any of them).
pub(crate) fn named_size(root: &str, name: Option<&str>) -> usize {
    NAMED_SIZES.with(|n| {
        let n = n.borrow();
        match name {
            Some(name) => n.get(&format!("{root}.{name}")).copied().unwrap_or(0),
            None => {
                let prefix = format!("{root}.");
                n.iter()
                    .filter(|(k, _)| k.starts_with(&prefix))
                    .map(|(_, v)| *v)
                    .sum()
            }
        }
    })
}

/// Why a value is refused.
#[derive(Debug, PartialEq)]
pub(crate) enum TooBig {
    /// Arrays and objects nested deeper than [`MAX_VALUE_DEPTH`].
    Deep,
    /// Larger than the limit given.
    Large,
}

/// The size of `v` (about: its JSON), if it is at most `max_bytes` and nested at most
/// [`MAX_VALUE_DEPTH`] levels. Iterative and stopping early, so any value can be
/// measured before anything recurses on it.
pub(crate) fn measure(v: &Value, max_bytes: usize) -> Result<usize, TooBig> {
    let mut size: usize = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(v, 0)];
    while let Some((v, depth)) = stack.pop() {
        let own = match v {
            Value::String(s) => s.len() + 2,
            Value::Object(m) => m.keys().map(|k| k.len() + 4).sum::<usize>() + 2,
            Value::Array(items) => items.len() + 2,
            _ => 8,
        };
        size = size.saturating_add(own);
        if size > max_bytes {
            return Err(TooBig::Large);
        }
        match v {
            Value::Array(_) | Value::Object(_) if depth >= MAX_VALUE_DEPTH => {
                return Err(TooBig::Deep);
            }
            Value::Array(items) => stack.extend(items.iter().map(|i| (i, depth + 1))),
            Value::Object(m) => stack.extend(m.values().map(|i| (i, depth + 1))),
            _ => {}
        }
    }
    Ok(size)
}

/// The message for a refused value.
pub(crate) fn too_big_message(why: TooBig, max_bytes: usize) -> String {
    match why {
        TooBig::Deep => {
            format!("the value is nested deeper than {MAX_VALUE_DEPTH} levels of lists and objects")
        }
        TooBig::Large => format!("the value is larger than {max_bytes} bytes"),
    }
}

/// Charge one call of one of our functions: 1, and the size of what it returns.
pub(crate) fn charge_result(result: Result<Value, String>) -> Result<Value, String> {
    let value = result?;
    charge(1)?;
    let size = measure(&value, left()).map_err(|why| match why {
        TooBig::Deep => too_big_message(why, 0),
        TooBig::Large => work_error(),
    })?;
    charge(size)?;
    Ok(value)
}
