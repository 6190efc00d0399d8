//! Nomad's ACL objects on the wire (`/v1/acl/...`): policies and tokens, PascalCase,
//! times in RFC 3339, `ExpirationTTL` in nanoseconds (or a duration string).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::duration;
use crate::acl;

/// A policy (`GET /v1/acl/policy/:name`, the body of `POST`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclPolicy {
    /// Name.
    pub name: String,
    /// Free text.
    pub description: String,
    /// Rules in HCL or JSON.
    pub rules: String,
    /// Index it was created at.
    pub create_index: u64,
    /// Index it was last changed at.
    pub modify_index: u64,
}

/// A policy in a listing (`GET /v1/acl/policies`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclPolicyListStub {
    /// Name.
    pub name: String,
    /// Free text.
    pub description: String,
    /// Index it was created at.
    pub create_index: u64,
    /// Index it was last changed at.
    pub modify_index: u64,
}

impl From<&acl::AclPolicy> for AclPolicy {
    fn from(p: &acl::AclPolicy) -> Self {
        AclPolicy {
            name: p.name.clone(),
            description: p.description.clone(),
            rules: p.rules.clone(),
            create_index: p.create_index,
            modify_index: p.modify_index,
        }
    }
}

impl From<&acl::AclPolicy> for AclPolicyListStub {
    fn from(p: &acl::AclPolicy) -> Self {
        AclPolicyListStub {
            name: p.name.clone(),
            description: p.description.clone(),
            create_index: p.create_index,
            modify_index: p.modify_index,
        }
    }
}

/// A token (`/v1/acl/token...`, `/v1/acl/bootstrap`). `SecretID` is served only when
/// the token was just made, and to a management token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclToken {
    /// Public id.
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    /// The secret (empty when not served).
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    /// Free text.
    pub name: String,
    /// `client` or `management`.
    #[serde(rename = "Type")]
    pub token_type: String,
    /// Policies of a client token.
    pub policies: Vec<String>,
    /// Roles (Drover has none; always empty).
    pub roles: Vec<serde_json::Value>,
    /// Replicated to every region.
    pub global: bool,
    /// RFC 3339.
    pub create_time: Option<String>,
    /// RFC 3339; none: never expires.
    pub expiration_time: Option<String>,
    /// The TTL asked for at creation.
    #[serde(rename = "ExpirationTTL", with = "duration::plain")]
    pub expiration_ttl: Duration,
    /// Index it was created at.
    pub create_index: u64,
    /// Index it was last changed at.
    pub modify_index: u64,
}

/// A token in a listing (`GET /v1/acl/tokens`): no secret.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AclTokenListStub {
    /// Public id.
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    /// Free text.
    pub name: String,
    /// `client` or `management`.
    #[serde(rename = "Type")]
    pub token_type: String,
    /// Policies.
    pub policies: Vec<String>,
    /// Roles (none).
    pub roles: Vec<serde_json::Value>,
    /// Replicated to every region.
    pub global: bool,
    /// RFC 3339.
    pub create_time: Option<String>,
    /// RFC 3339.
    pub expiration_time: Option<String>,
    /// Index it was created at.
    pub create_index: u64,
    /// Index it was last changed at.
    pub modify_index: u64,
}

/// Unix nanoseconds as RFC 3339 (UTC, nanoseconds).
pub fn format_time(nanos: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_nanos(u64::try_from(nanos).unwrap_or(0));
    humantime::format_rfc3339_nanos(t).to_string()
}

/// RFC 3339 as unix nanoseconds; Go's zero time (`0001-01-01T00:00:00Z`) is none.
pub fn parse_time(text: &str) -> Result<Option<i64>, String> {
    if text.is_empty() || text.starts_with("0001-01-01") {
        return Ok(None);
    }
    let t: SystemTime = humantime::parse_rfc3339_weak(text.trim_end_matches('Z'))
        .or_else(|_| humantime::parse_rfc3339(text))
        .map_err(|e| format!("{text:?} is not an RFC 3339 time: {e}"))?;
    let d = t
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("{text:?} is before 1970"))?;
    Ok(Some(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)))
}

impl AclToken {
    /// The wire form of `t`, with `secret` when it may be served.
    pub fn from_stored(t: &acl::AclToken, secret: Option<&str>) -> AclToken {
        AclToken {
            accessor_id: t.accessor_id.clone(),
            secret_id: secret.unwrap_or_default().to_owned(),
            name: t.name.clone(),
            token_type: t.token_type.clone(),
            policies: t.policies.clone(),
            roles: Vec::new(),
            global: t.global,
            create_time: Some(format_time(t.create_time)),
            expiration_time: t.expiration_time.map(format_time),
            expiration_ttl: Duration::from_nanos(u64::try_from(t.expiration_ttl).unwrap_or(0)),
            create_index: t.create_index,
            modify_index: t.modify_index,
        }
    }
}

impl From<&acl::AclToken> for AclTokenListStub {
    fn from(t: &acl::AclToken) -> Self {
        AclTokenListStub {
            accessor_id: t.accessor_id.clone(),
            name: t.name.clone(),
            token_type: t.token_type.clone(),
            policies: t.policies.clone(),
            roles: Vec::new(),
            global: t.global,
            create_time: Some(format_time(t.create_time)),
            expiration_time: t.expiration_time.map(format_time),
            create_index: t.create_index,
            modify_index: t.modify_index,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_and_go_zero_is_none() {
        let n = 1_700_000_000_123_456_789;
        assert_eq!(parse_time(&format_time(n)).unwrap(), Some(n));
        assert_eq!(parse_time("0001-01-01T00:00:00Z").unwrap(), None);
        assert!(parse_time("yesterday").is_err());
    }

    #[test]
    fn tokens_read_nomads_json() {
        let t: AclToken = serde_json::from_str(
            r#"{"Name":"ro","Type":"client","Policies":["a"],"ExpirationTTL":3600000000000}"#,
        )
        .unwrap();
        assert_eq!(t.expiration_ttl, Duration::from_secs(3600));
        let t: AclToken = serde_json::from_str(r#"{"ExpirationTTL":"10m"}"#).unwrap();
        assert_eq!(t.expiration_ttl, Duration::from_secs(600));
    }
}
