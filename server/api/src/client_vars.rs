//! The client's calls for variables (`/v1/var/:path`, `/v1/vars`) and the keyring
//! (`/v1/operator/keyring/...`).

use std::collections::BTreeMap;

use hyper::{Method, StatusCode};

use crate::Index;
use crate::client::{Client, Error, RawAnswer};
use crate::variables::{KeyringRotateResponse, RootKeyMeta, Variable, VariableMetadata};

/// What a check-and-set write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VarWriteOutcome {
    /// Written (for a purge: gone); the variable as written (a purge: none), and the
    /// commit's index.
    Done(Option<Variable>, Index),
    /// The check index did not match: the variable as it is (a missing one has
    /// `modify_index` 0). Nothing was written.
    Conflict(Variable),
}

fn query(namespace: Option<&str>, extra: &[(&str, String)]) -> String {
    let mut pairs: Vec<(&str, String)> = Vec::new();
    if let Some(ns) = namespace {
        pairs.push(("namespace", ns.to_owned()));
    }
    pairs.extend(extra.iter().cloned());
    let q = serde_urlencoded::to_string(&pairs).unwrap_or_default();
    if q.is_empty() { q } else { format!("?{q}") }
}

fn var_path(path: &str) -> Result<String, Error> {
    crate::variables::validate_path(path).map_err(Error::InvalidRequest)?;
    // Path characters are URL-safe: sent as they are.
    Ok(format!("/v1/var/{path}"))
}

fn decode<T: serde::de::DeserializeOwned>(request: &str, a: &RawAnswer) -> Result<T, Error> {
    serde_json::from_slice(&a.body).map_err(|source| Error::Decode {
        request: request.to_owned(),
        source,
    })
}

fn refused(request: &str, a: &RawAnswer) -> Error {
    Error::Status {
        status: a.status,
        message: a
            .error_message()
            .unwrap_or_else(|| format!("{request}: {}", a.status)),
    }
}

impl Client {
    /// `GET /v1/var/:path`: the variable, `None` when there is none.
    pub async fn variable(
        &self,
        path: &str,
        namespace: Option<&str>,
    ) -> Result<Option<Variable>, Error> {
        let p = var_path(path)?;
        let request = format!("GET {p}");
        let a = self
            .raw(Method::GET, &format!("{p}{}", query(namespace, &[])), None)
            .await?;
        match a.status {
            StatusCode::OK => decode(&request, &a).map(Some),
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(refused(&request, &a)),
        }
    }

    /// `GET /v1/vars?prefix=`: the variables under `prefix`, without their items.
    pub async fn variables(
        &self,
        prefix: &str,
        namespace: Option<&str>,
    ) -> Result<Vec<VariableMetadata>, Error> {
        let request = "GET /v1/vars".to_owned();
        let q = query(namespace, &[("prefix", prefix.to_owned())]);
        let a = self.raw(Method::GET, &format!("/v1/vars{q}"), None).await?;
        if a.status != StatusCode::OK {
            return Err(refused(&request, &a));
        }
        decode(&request, &a)
    }

    /// `PUT /v1/var/:path[?cas=N]` with `items`.
    pub async fn put_variable(
        &self,
        path: &str,
        namespace: Option<&str>,
        items: BTreeMap<String, String>,
        cas: Option<Index>,
    ) -> Result<VarWriteOutcome, Error> {
        let p = var_path(path)?;
        let request = format!("PUT {p}");
        let extra: Vec<(&str, String)> = cas.map(|c| ("cas", c.to_string())).into_iter().collect();
        let body = Variable {
            namespace: namespace
                .or(self.namespace())
                .unwrap_or_default()
                .to_owned(),
            path: path.to_owned(),
            items,
            ..Variable::default()
        };
        let body = serde_json::to_vec(&body).map_err(|e| Error::InvalidRequest(e.to_string()))?;
        let a = self
            .raw(
                Method::PUT,
                &format!("{p}{}", query(namespace, &extra)),
                Some(body),
            )
            .await?;
        match a.status {
            StatusCode::OK => {
                let v: Variable = decode(&request, &a)?;
                let index = a.index.unwrap_or(v.modify_index);
                Ok(VarWriteOutcome::Done(Some(v), index))
            }
            StatusCode::CONFLICT => decode(&request, &a).map(VarWriteOutcome::Conflict),
            _ => Err(refused(&request, &a)),
        }
    }

    /// `DELETE /v1/var/:path[?cas=N]`.
    pub async fn delete_variable(
        &self,
        path: &str,
        namespace: Option<&str>,
        cas: Option<Index>,
    ) -> Result<VarWriteOutcome, Error> {
        let p = var_path(path)?;
        let request = format!("DELETE {p}");
        let extra: Vec<(&str, String)> = cas.map(|c| ("cas", c.to_string())).into_iter().collect();
        let a = self
            .raw(
                Method::DELETE,
                &format!("{p}{}", query(namespace, &extra)),
                None,
            )
            .await?;
        match a.status {
            StatusCode::OK | StatusCode::NO_CONTENT => {
                Ok(VarWriteOutcome::Done(None, a.index.unwrap_or(0)))
            }
            StatusCode::CONFLICT => decode(&request, &a).map(VarWriteOutcome::Conflict),
            _ => Err(refused(&request, &a)),
        }
    }

    /// `GET /v1/operator/keyring/keys`.
    pub async fn keyring_keys(&self) -> Result<Vec<RootKeyMeta>, Error> {
        let request = "GET /v1/operator/keyring/keys";
        let a = self
            .raw(Method::GET, "/v1/operator/keyring/keys", None)
            .await?;
        if a.status != StatusCode::OK {
            return Err(refused(request, &a));
        }
        decode(request, &a)
    }

    /// `PUT /v1/operator/keyring/rotate[?full]`.
    pub async fn rotate_keyring(&self, full: bool) -> Result<KeyringRotateResponse, Error> {
        let request = "PUT /v1/operator/keyring/rotate";
        let path = if full {
            "/v1/operator/keyring/rotate?full=true"
        } else {
            "/v1/operator/keyring/rotate"
        };
        let a = self.raw(Method::PUT, path, None).await?;
        if a.status != StatusCode::OK {
            return Err(refused(request, &a));
        }
        decode(request, &a)
    }
}
