//! The `${...}` references of Nomad's client-side interpolation, and nothing more.
//!
//! What is accepted (Nomad's own rule, `helper/args.ReplaceEnv`: the regular
//! expression `\$\{[a-zA-Z0-9_\-\.]+\}`):
//!
//! - `${NAME}` where NAME is one or more of `A-Z a-z 0-9 _ - .`: replaced by the value
//!   the lookup gives for NAME (`NOMAD_ALLOC_INDEX`, `attr.kernel.name`, ...).
//! - With [`Syntax::Config`] also `${env["NAME"]}` (Nomad evaluates a task's `config`
//!   as HCL2, where the task's variables are also the map `env`): replaced by the
//!   lookup of NAME. NAME is anything without `"` or `\`; spaces around the index are
//!   not allowed.
//!
//! Everything else is left exactly as it is: a reference the lookup does not know
//! (Nomad leaves those), `${` without a matching `}`, an empty `${}`, a name with other
//! characters (`${a b}`, `${upper("x")}`: HCL functions are not evaluated). A value put
//! in is never scanned again, so a value holding `${...}` stays as it is. There is no
//! escape: `$${X}` is `$` followed by the reference `${X}` (job files' `$${` escapes
//! are undone by the job file parser before the job reaches the client).

use std::borrow::Cow;

/// The most bytes interpolation may add to one task's environment and config
/// together. A reference is replaced by its whole value, so a small job could
/// otherwise multiply into gigabytes on every node it is placed on (a 60 KB meta value
/// referenced a thousand times in an env value, itself referenced in every config
/// argument).
pub const MAX_GROWTH_BYTES: usize = 1024 * 1024;

/// What interpolation may still add (see [`MAX_GROWTH_BYTES`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    left: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            left: MAX_GROWTH_BYTES,
        }
    }
}

/// Interpolation would add more than [`MAX_GROWTH_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the task's ${{...}} references would add more than {} KiB to its environment and config",
    MAX_GROWTH_BYTES / 1024
)]
pub struct TooLarge;

impl Budget {
    fn charge(&mut self, added: usize) -> Result<(), TooLarge> {
        self.left = self.left.checked_sub(added).ok_or(TooLarge)?;
        Ok(())
    }
}

/// Which forms of reference are recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// `${NAME}` only: environment values and meta (Nomad's `ReplaceEnv`).
    Plain,
    /// `${NAME}` and `${env["NAME"]}`: the strings of a task's `config`.
    Config,
}

fn name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')
}

/// The reference starting at `text[at..]` (which starts with `${`): its name and the
/// length of the whole reference, if it is one.
fn reference(text: &str, at: usize, syntax: Syntax) -> Option<(&str, usize)> {
    let rest = &text[at + 2..];
    let plain = rest.bytes().take_while(|b| name_byte(*b)).count();
    if plain > 0 && rest.as_bytes().get(plain) == Some(&b'}') {
        return Some((&rest[..plain], plain + 3));
    }
    if syntax == Syntax::Config {
        let inner = rest.strip_prefix("env[\"")?;
        let end = inner.find(['"', '\\'])?;
        if inner[end..].starts_with("\"]}") && end > 0 {
            return Some((&inner[..end], "env[\"".len() + end + "\"]}".len() + 2));
        }
    }
    None
}

/// `text` with every reference `lookup` knows replaced by its value (borrowed when
/// nothing was replaced); what the values add beyond the references' own text is
/// charged to `budget`.
pub fn interpolate<'t, 'v>(
    text: &'t str,
    syntax: Syntax,
    lookup: impl Fn(&str) -> Option<&'v str>,
    budget: &mut Budget,
) -> Result<Cow<'t, str>, TooLarge> {
    let Some(first) = text.find("${") else {
        return Ok(Cow::Borrowed(text));
    };
    let mut out = String::new();
    // `text[copied..]` is not in `out` yet; `at` is the next `${` to look at.
    let mut copied = 0;
    let mut at = first;
    loop {
        let mut next = at + 2;
        if let Some((name, len)) = reference(text, at, syntax)
            && let Some(value) = lookup(name)
        {
            budget.charge(value.len().saturating_sub(len))?;
            out.push_str(&text[copied..at]);
            out.push_str(value);
            copied = at + len;
            next = copied;
        }
        match text[next..].find("${") {
            Some(i) => at = next + i,
            None => break,
        }
    }
    if copied == 0 {
        return Ok(Cow::Borrowed(text));
    }
    out.push_str(&text[copied..]);
    Ok(Cow::Owned(out))
}

/// Interpolate every string of a JSON value (object keys stay as they are: they are the
/// driver's option names), in place. Returns how many strings changed.
pub fn interpolate_json<'v>(
    value: &mut serde_json::Value,
    lookup: &dyn Fn(&str) -> Option<&'v str>,
    budget: &mut Budget,
) -> Result<usize, TooLarge> {
    Ok(match value {
        serde_json::Value::String(s) => match interpolate(s, Syntax::Config, lookup, budget)? {
            Cow::Owned(new) => {
                *s = new;
                1
            }
            Cow::Borrowed(_) => 0,
        },
        serde_json::Value::Array(items) => {
            let mut n = 0;
            for v in items {
                n += interpolate_json(v, lookup, budget)?;
            }
            n
        }
        serde_json::Value::Object(map) => {
            let mut n = 0;
            for v in map.values_mut() {
                n += interpolate_json(v, lookup, budget)?;
            }
            n
        }
        _ => 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn vars() -> BTreeMap<&'static str, &'static str> {
        BTreeMap::from([
            ("NOMAD_ALLOC_INDEX", "2"),
            ("attr.kernel.name", "linux"),
            ("node-x.y_z", "ok"),
            ("LOOP", "${NOMAD_ALLOC_INDEX}"),
            ("EMPTY", ""),
            ("weird name", "w"),
        ])
    }

    fn plain(text: &str) -> String {
        let v = vars();
        interpolate(
            text,
            Syntax::Plain,
            |k| v.get(k).copied(),
            &mut Budget::default(),
        )
        .expect("within the budget")
        .into_owned()
    }

    fn config(text: &str) -> String {
        let v = vars();
        interpolate(
            text,
            Syntax::Config,
            |k| v.get(k).copied(),
            &mut Budget::default(),
        )
        .expect("within the budget")
        .into_owned()
    }

    #[test]
    fn known_references_are_replaced_everywhere_in_the_text() {
        assert_eq!(plain("${NOMAD_ALLOC_INDEX}"), "2");
        assert_eq!(
            plain("i=${NOMAD_ALLOC_INDEX}, k=${attr.kernel.name}!"),
            "i=2, k=linux!"
        );
        assert_eq!(plain("${NOMAD_ALLOC_INDEX}${NOMAD_ALLOC_INDEX}"), "22");
        assert_eq!(plain("${node-x.y_z}"), "ok");
        assert_eq!(plain("[${EMPTY}]"), "[]");
        // A `$` before a reference is text.
        assert_eq!(plain("$${NOMAD_ALLOC_INDEX}"), "$2");
        assert_eq!(plain("$$"), "$$");
        // Non-ASCII around references.
        assert_eq!(plain("é${NOMAD_ALLOC_INDEX}→"), "é2→");
    }

    #[test]
    fn anything_else_stays_as_it_is() {
        for text in [
            "",
            "no references",
            "${UNKNOWN}",
            "${}",
            "${",
            "${NOMAD_ALLOC_INDEX",
            "$NOMAD_ALLOC_INDEX",
            "${ NOMAD_ALLOC_INDEX }",
            "${weird name}",
            "${upper(\"x\")}",
            "${env[\"NOMAD_ALLOC_INDEX\"]}",
            "}${",
        ] {
            assert_eq!(plain(text), text, "{text:?}");
        }
        // Unknown and known side by side: only the known one changes.
        assert_eq!(plain("${UNKNOWN}-${NOMAD_ALLOC_INDEX}"), "${UNKNOWN}-2");
        // An unclosed reference before a good one does not swallow it.
        assert_eq!(plain("${oops ${NOMAD_ALLOC_INDEX}"), "${oops 2");
    }

    #[test]
    fn values_are_not_scanned_again() {
        assert_eq!(plain("${LOOP}"), "${NOMAD_ALLOC_INDEX}");
    }

    #[test]
    fn config_strings_also_take_the_env_map() {
        assert_eq!(config("${env[\"NOMAD_ALLOC_INDEX\"]}"), "2");
        assert_eq!(config("a${env[\"weird name\"]}b"), "awb");
        assert_eq!(config("${NOMAD_ALLOC_INDEX}"), "2");
        for text in [
            "${env[\"UNKNOWN\"]}",
            "${env[\"\"]}",
            "${env[NOMAD_ALLOC_INDEX]}",
            "${env[\"NOMAD_ALLOC_INDEX\"] }",
            "${env[\"a\\\"b\"]}",
            "${env[\"NOMAD_ALLOC_INDEX\"",
        ] {
            assert_eq!(config(text), text, "{text:?}");
        }
    }

    #[test]
    fn nothing_replaced_borrows() {
        let v = vars();
        assert!(matches!(
            interpolate(
                "${UNKNOWN} x",
                Syntax::Plain,
                |k| v.get(k).copied(),
                &mut Budget::default()
            ),
            Ok(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn every_string_of_a_config_nested_or_not() {
        let v = vars();
        let mut config = serde_json::json!({
            "command": "/bin/echo",
            "args": ["${NOMAD_ALLOC_INDEX}", "${UNKNOWN}", 3, true, null],
            "nested": {"deeper": [{"k": "kernel ${attr.kernel.name}"}]},
            "${NOMAD_ALLOC_INDEX}": "keys stay",
        });
        let changed = interpolate_json(&mut config, &|k| v.get(k).copied(), &mut Budget::default())
            .expect("within the budget");
        assert_eq!(changed, 2);
        assert_eq!(
            config,
            serde_json::json!({
                "command": "/bin/echo",
                "args": ["2", "${UNKNOWN}", 3, true, null],
                "nested": {"deeper": [{"k": "kernel linux"}]},
                "${NOMAD_ALLOC_INDEX}": "keys stay",
            })
        );
    }

    #[test]
    fn what_references_add_is_bounded() {
        let big = "x".repeat(60_000);
        let v = BTreeMap::from([("BIG", big.as_str())]);
        let mut budget = Budget::default();
        // Each reference adds its value's length less its own text.
        let once = interpolate("${BIG}", Syntax::Plain, |k| v.get(k).copied(), &mut budget)
            .expect("one fits");
        assert_eq!(once.len(), 60_000);
        // A thousand references in one value: refused, not gigabytes.
        let many = "${BIG}".repeat(1000);
        assert_eq!(
            interpolate(&many, Syntax::Plain, |k| v.get(k).copied(), &mut budget),
            Err(TooLarge)
        );
        // The budget is shared: strings of a config count together.
        let mut config = serde_json::json!({"args": vec!["${BIG}"; 40]});
        assert_eq!(
            interpolate_json(&mut config, &|k| v.get(k).copied(), &mut Budget::default()),
            Err(TooLarge)
        );
        assert!(TooLarge.to_string().contains("1024 KiB"), "{TooLarge}");
    }
}
