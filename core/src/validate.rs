//! Field-level validation errors.
//!
//! Validation never stops at the first problem: every rule that fails adds a [`FieldError`]
//! naming the offending field by its path in the request (`shape.gpus`, `env.PATH`), so a user
//! fixes a request in one round trip. The API turns the list into `problem+json`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One problem with one field of a request or a configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FieldError {
    /// Dotted path of the field, e.g. `shape.gpus` or `checkpoint.uri`.
    pub field: String,
    /// What is wrong, in words meant for the person who wrote the request.
    pub message: String,
    /// The named bound the field is over ([`crate::limits`]), when that is what is wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every problem found while validating one value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldErrors(Vec<FieldError>);

impl FieldErrors {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            field: field.into(),
            message: message.into(),
            limit: None,
        });
    }

    /// Adds that `field` is over `limit`; the message is about the value ("has 5000").
    pub fn push_over(
        &mut self,
        field: impl Into<String>,
        limit: &crate::limits::Limit,
        message: impl std::fmt::Display,
    ) {
        self.0.push(FieldError {
            field: field.into(),
            message: format!(
                "{message}: at most {} {} (limit {})",
                limit.max, limit.unit, limit.name
            ),
            limit: Some(limit.name.to_owned()),
        });
    }

    /// Checks `value` with [`check_name`], adding what is wrong under `field`; a name that is too
    /// long names the [`crate::limits::NAME_CHARS`] limit.
    pub fn check_name(&mut self, field: &str, value: &str) {
        let limit = &crate::limits::NAME_CHARS;
        let chars = value.chars().count();
        if chars as u64 > limit.max {
            self.push_over(field, limit, format_args!("has {chars} characters"));
        } else if let Err(m) = check_name(value) {
            self.push(field, m);
        }
    }

    /// Adds the errors of a nested value, prefixing their paths with `prefix`.
    pub fn extend_nested(&mut self, prefix: &str, nested: FieldErrors) {
        for e in nested.0 {
            let field = if e.field.is_empty() {
                prefix.to_owned()
            } else {
                format!("{prefix}.{}", e.field)
            };
            self.0.push(FieldError {
                field,
                message: e.message,
                limit: e.limit,
            });
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &FieldError> {
        self.0.iter()
    }

    pub fn into_vec(self) -> Vec<FieldError> {
        self.0
    }

    /// `Ok(())` when nothing was found, the errors otherwise.
    pub fn into_result(self) -> Result<(), FieldErrors> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }
}

impl fmt::Display for FieldErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for FieldErrors {}

impl From<FieldError> for FieldErrors {
    fn from(e: FieldError) -> Self {
        FieldErrors(vec![e])
    }
}

/// A name users type: 1–63 characters of lowercase letters, digits, `-`, `_` and `.`,
/// starting with a letter or digit. Used for teams, jobs and tokens.
pub fn check_name(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    let max = crate::limits::NAME_CHARS.max;
    if value.len() as u64 > max {
        return Err(format!(
            "must be at most {max} characters, got {} (limit {})",
            value.chars().count(),
            crate::limits::NAME_CHARS.name
        ));
    }
    let mut chars = value.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !first_ok {
        return Err("must start with a lowercase letter or a digit".into());
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "may hold only lowercase letters, digits, '-', '_' and '.', found {bad:?}"
        ));
    }
    Ok(())
}

/// A team secret's name follows the same rule as [`check_name`].
pub fn check_secret_name(value: &str) -> Result<(), String> {
    check_name(value).map_err(|m| format!("secret name {m}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_documented_alphabet() {
        for ok in ["a", "llama-ft", "team_1", "v1.2", "0abc"] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", "-x", "Upper", "with space", "ü", &"a".repeat(64)] {
            assert!(check_name(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn nested_errors_carry_their_parent_path() {
        let mut inner = FieldErrors::new();
        inner.push("gpus", "too many");
        inner.push("", "bad shape");
        let mut outer = FieldErrors::new();
        outer.extend_nested("shape", inner);
        let fields: Vec<_> = outer.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["shape.gpus", "shape"]);
    }

    #[test]
    fn a_long_name_names_its_limit_and_a_bad_one_does_not() {
        let mut errs = FieldErrors::new();
        errs.check_name("name", &"a".repeat(64));
        errs.check_name("cohort", "Upper");
        errs.check_name("ok", "fine");
        let got: Vec<_> = errs
            .iter()
            .map(|e| (e.field.as_str(), e.limit.as_deref()))
            .collect();
        assert_eq!(got, [("name", Some("name_chars")), ("cohort", None)]);
    }
}
