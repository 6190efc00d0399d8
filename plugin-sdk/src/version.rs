//! Plugin API version negotiation (the semver level above the app protocol).

use semver::{Version, VersionReq};

/// The plugin API version this SDK implements.
pub const PLUGIN_API_VERSION: &str = "1.0.0";

/// The range of plugin API versions a host built from this SDK accepts.
pub const SUPPORTED_API_RANGE: &str = "^1.0.0";

/// Why no plugin API version could be agreed on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VersionError {
    /// A version string is not semver.
    #[error("{value:?} is not a semantic version: {reason}")]
    Invalid {
        /// The text given.
        value: String,
        /// What semver said.
        reason: String,
    },
    /// None of the plugin's versions lies in the host's range.
    #[error("no common plugin API version: plugin offers [{offered}], host accepts {accepted}")]
    NoCommon {
        /// The plugin's versions, comma separated.
        offered: String,
        /// The host's range.
        accepted: String,
    },
}

/// Parse a semver version, accepting a leading `v` (`v1.2.3`) as other ecosystems write it.
///
/// ```
/// use drover_plugin_sdk::version::parse_version;
/// assert_eq!(parse_version("v1.2.3").unwrap(), semver::Version::new(1, 2, 3));
/// assert!(parse_version("1.2").is_err());
/// ```
pub fn parse_version(text: &str) -> Result<Version, VersionError> {
    let trimmed = text.trim();
    let bare = trimmed.strip_prefix('v').unwrap_or(trimmed);
    Version::parse(bare).map_err(|e| VersionError::Invalid {
        value: text.to_owned(),
        reason: e.to_string(),
    })
}

/// Pick the highest of the plugin's `offered` API versions that `accepted` matches.
/// Unparsable entries are an error: a plugin that lies about its versions is not loaded.
///
/// ```
/// use drover_plugin_sdk::version::negotiate_api_version;
/// let req = semver::VersionReq::parse("^1.0.0").unwrap();
/// let v = negotiate_api_version(&["0.9.0".into(), "v1.2.0".into(), "1.1.0".into()], &req).unwrap();
/// assert_eq!(v, semver::Version::new(1, 2, 0));
/// assert!(negotiate_api_version(&["2.0.0".into()], &req).is_err());
/// ```
pub fn negotiate_api_version(
    offered: &[String],
    accepted: &VersionReq,
) -> Result<Version, VersionError> {
    let mut best: Option<Version> = None;
    for text in offered {
        let v = parse_version(text)?;
        if accepted.matches(&v) && best.as_ref().is_none_or(|b| v > *b) {
            best = Some(v);
        }
    }
    best.ok_or_else(|| VersionError::NoCommon {
        offered: offered.join(", "),
        accepted: accepted.to_string(),
    })
}

/// The host's default accepted range, [`SUPPORTED_API_RANGE`].
pub fn supported_api_range() -> VersionReq {
    // The constant is a valid requirement; a unit test pins it.
    VersionReq::parse(SUPPORTED_API_RANGE).unwrap_or(VersionReq::STAR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_parse() {
        assert!(VersionReq::parse(SUPPORTED_API_RANGE).is_ok());
        assert!(supported_api_range().matches(&parse_version(PLUGIN_API_VERSION).unwrap()));
    }

    #[test]
    fn newer_plugin_older_host() {
        // Plugin speaks 1.0 and 2.0; host only ^1 -> 1.0.0.
        let host = VersionReq::parse("^1.0.0").unwrap();
        let v = negotiate_api_version(&["2.0.0".into(), "1.0.0".into()], &host).unwrap();
        assert_eq!(v, Version::new(1, 0, 0));
    }

    #[test]
    fn older_plugin_newer_host() {
        // Host accepts >=1.0, <3; plugin only 1.4 -> 1.4.
        let host = VersionReq::parse(">=1.0.0, <3.0.0").unwrap();
        let v = negotiate_api_version(&["v1.4.0".into()], &host).unwrap();
        assert_eq!(v, Version::new(1, 4, 0));
    }

    #[test]
    fn no_common_names_both_sides() {
        let host = VersionReq::parse("^1.0.0").unwrap();
        let err = negotiate_api_version(&["0.1.0".into(), "2.0.0".into()], &host)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("0.1.0, 2.0.0") && err.contains("^1.0.0"),
            "{err}"
        );
    }

    #[test]
    fn garbage_version_is_an_error() {
        let host = VersionReq::parse("^1.0.0").unwrap();
        let err = negotiate_api_version(&["one".into()], &host).unwrap_err();
        assert!(matches!(err, VersionError::Invalid { .. }));
    }
}
