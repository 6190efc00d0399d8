//! `/v1/acl/*` (Nomad's ACL endpoints): the bootstrap, policies and tokens.

use hyper::{Method, StatusCode};

use super::{Answer, Client, Error, QueryOptions, path, read_body, refusal};
use crate::Index;
use crate::nomad::{AclPolicy, AclPolicyListStub, AclToken, AclTokenListStub};

impl Client {
    /// A write whose answer has no body: its index.
    pub(super) async fn write_no_answer(
        &self,
        method: Method,
        segments: &[&str],
        body: Option<Vec<u8>>,
    ) -> Result<Index, Error> {
        let path = path(segments)?;
        let request = format!("{method} {path}");
        let resp = self.send(method, &path, None, body).await?;
        let status = resp.status();
        let index = super::index_of(resp.headers()).unwrap_or(0);
        let body = read_body(&request, resp.into_body()).await?;
        if status != StatusCode::OK {
            return Err(refusal(&request, status, &body));
        }
        Ok(index)
    }

    /// `POST /v1/acl/bootstrap`: the first management token, with its secret.
    pub async fn acl_bootstrap(&self) -> Result<AclToken, Error> {
        self.write::<(), _>(Method::POST, &["v1", "acl", "bootstrap"], None, None)
            .await
    }

    /// `GET /v1/acl/policies`.
    pub async fn acl_policies(&self) -> Result<Answer<Vec<AclPolicyListStub>>, Error> {
        self.read(&["v1", "acl", "policies"], &QueryOptions::default())
            .await
    }

    /// `GET /v1/acl/policy/:name`.
    pub async fn acl_policy(&self, name: &str) -> Result<Answer<AclPolicy>, Error> {
        self.read(&["v1", "acl", "policy", name], &QueryOptions::default())
            .await
    }

    /// `POST /v1/acl/policy/:name`: create or replace.
    pub async fn put_acl_policy(&self, policy: &AclPolicy) -> Result<Index, Error> {
        let body = serde_json::to_vec(policy)
            .map_err(|e| Error::InvalidRequest(format!("cannot encode the policy: {e}")))?;
        self.write_no_answer(
            Method::POST,
            &["v1", "acl", "policy", &policy.name],
            Some(body),
        )
        .await
    }

    /// `DELETE /v1/acl/policy/:name`.
    pub async fn delete_acl_policy(&self, name: &str) -> Result<Index, Error> {
        self.write_no_answer(Method::DELETE, &["v1", "acl", "policy", name], None)
            .await
    }

    /// `GET /v1/acl/tokens`.
    pub async fn acl_tokens(&self) -> Result<Answer<Vec<AclTokenListStub>>, Error> {
        self.read(&["v1", "acl", "tokens"], &QueryOptions::default())
            .await
    }

    /// `POST /v1/acl/token`: a new token, with its secret.
    pub async fn create_acl_token(&self, token: &AclToken) -> Result<AclToken, Error> {
        self.write(Method::POST, &["v1", "acl", "token"], None, Some(token))
            .await
    }

    /// `GET /v1/acl/token/:accessor`.
    pub async fn acl_token(&self, accessor: &str) -> Result<Answer<AclToken>, Error> {
        self.read(&["v1", "acl", "token", accessor], &QueryOptions::default())
            .await
    }

    /// `GET /v1/acl/token/self`.
    pub async fn acl_token_self(&self) -> Result<Answer<AclToken>, Error> {
        self.read(&["v1", "acl", "token", "self"], &QueryOptions::default())
            .await
    }

    /// `DELETE /v1/acl/token/:accessor`.
    pub async fn delete_acl_token(&self, accessor: &str) -> Result<Index, Error> {
        self.write_no_answer(Method::DELETE, &["v1", "acl", "token", accessor], None)
            .await
    }
}
