//! Evaluation of conditional request headers (RFC 7232 as S3 applies them).

/// An `If-Match` / `If-None-Match` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtagCondition {
    /// `*`: any existing object.
    Any,
    /// A specific ETag value (without quotes).
    Etag(String),
}

impl EtagCondition {
    fn matches(&self, etag: &str) -> bool {
        match self {
            EtagCondition::Any => true,
            EtagCondition::Etag(e) => e == etag,
        }
    }
}

/// The conditional headers of a read request. Times are Unix seconds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conditions {
    /// `If-Match`.
    pub if_match: Option<EtagCondition>,
    /// `If-None-Match`.
    pub if_none_match: Option<EtagCondition>,
    /// `If-Modified-Since`, Unix seconds.
    pub if_modified_since: Option<i64>,
    /// `If-Unmodified-Since`, Unix seconds.
    pub if_unmodified_since: Option<i64>,
}

/// Outcome of [`Conditions::evaluate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Serve the object.
    Proceed,
    /// 304 Not Modified.
    NotModified,
    /// 412 Precondition Failed.
    PreconditionFailed,
}

impl Conditions {
    /// Evaluates the conditions against an object's ETag and last-modified
    /// time (Unix seconds; HTTP dates have one-second resolution, so callers
    /// pass the truncated time).
    ///
    /// As in S3: If-Match takes precedence over If-Unmodified-Since and
    /// If-None-Match over If-Modified-Since; 412 conditions are checked first.
    #[must_use]
    pub fn evaluate(&self, etag: &str, last_modified: i64) -> Verdict {
        match &self.if_match {
            Some(c) => {
                if !c.matches(etag) {
                    return Verdict::PreconditionFailed;
                }
            }
            None => {
                if let Some(t) = self.if_unmodified_since
                    && last_modified > t
                {
                    return Verdict::PreconditionFailed;
                }
            }
        }
        match &self.if_none_match {
            Some(c) => {
                if c.matches(etag) {
                    return Verdict::NotModified;
                }
            }
            None => {
                if let Some(t) = self.if_modified_since
                    && last_modified <= t
                {
                    return Verdict::NotModified;
                }
            }
        }
        Verdict::Proceed
    }

    /// Whether any condition is set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Conditions::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(s: &str) -> Option<EtagCondition> {
        Some(EtagCondition::Etag(s.into()))
    }

    const T: i64 = 1_700_000_000;

    #[test]
    fn none_proceeds() {
        assert_eq!(Conditions::default().evaluate("x", T), Verdict::Proceed);
    }

    #[test]
    fn if_match() {
        let c = Conditions {
            if_match: e("x"),
            ..Default::default()
        };
        assert_eq!(c.evaluate("x", T), Verdict::Proceed);
        assert_eq!(c.evaluate("y", T), Verdict::PreconditionFailed);
        let c = Conditions {
            if_match: Some(EtagCondition::Any),
            ..Default::default()
        };
        assert_eq!(c.evaluate("y", T), Verdict::Proceed);
    }

    #[test]
    fn if_none_match() {
        let c = Conditions {
            if_none_match: e("x"),
            ..Default::default()
        };
        assert_eq!(c.evaluate("x", T), Verdict::NotModified);
        assert_eq!(c.evaluate("y", T), Verdict::Proceed);
        let c = Conditions {
            if_none_match: Some(EtagCondition::Any),
            ..Default::default()
        };
        assert_eq!(c.evaluate("y", T), Verdict::NotModified);
    }

    #[test]
    fn modified_since() {
        let c = Conditions {
            if_modified_since: Some(T),
            ..Default::default()
        };
        assert_eq!(c.evaluate("x", T), Verdict::NotModified);
        assert_eq!(c.evaluate("x", T - 1), Verdict::NotModified);
        assert_eq!(c.evaluate("x", T + 1), Verdict::Proceed);
    }

    #[test]
    fn unmodified_since() {
        let c = Conditions {
            if_unmodified_since: Some(T),
            ..Default::default()
        };
        assert_eq!(c.evaluate("x", T), Verdict::Proceed);
        assert_eq!(c.evaluate("x", T + 1), Verdict::PreconditionFailed);
    }

    #[test]
    fn precedence() {
        // If-Match true overrides a failing If-Unmodified-Since.
        let c = Conditions {
            if_match: e("x"),
            if_unmodified_since: Some(T - 10),
            ..Default::default()
        };
        assert_eq!(c.evaluate("x", T), Verdict::Proceed);
        // If-None-Match false (etag differs) overrides If-Modified-Since.
        let c = Conditions {
            if_none_match: e("y"),
            if_modified_since: Some(T + 10),
            ..Default::default()
        };
        assert_eq!(c.evaluate("x", T), Verdict::Proceed);
        // 412 wins over 304.
        let c = Conditions {
            if_match: e("y"),
            if_none_match: e("x"),
            ..Default::default()
        };
        assert_eq!(c.evaluate("x", T), Verdict::PreconditionFailed);
    }
}
