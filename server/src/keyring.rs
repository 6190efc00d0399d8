//! The keyring: root keys that encrypt variables (AES-256-GCM) and sign workload
//! identities (Ed25519 JWTs), and the key-encryption key (KEK) that keeps the root keys
//! out of the store in clear.
//!
//! A root key is 32 random bytes with an id (a UUID), a state (`active`: new
//! encryptions and signatures use it, one at a time; `inactive`: kept to decrypt and to
//! verify what it made) and a creation time. The store holds each root key's metadata
//! and its material *wrapped* (AES-256-GCM) by the KEK, under `rootkey/<id>`; every
//! server reads them from the store as it reads the rest of the state, and unwraps them
//! with the KEK it was given. The KEK never reaches the store: it is a file each server
//! reads at start (`--keyring-kek-file`; a single server generates one in its data dir
//! on first start, 0600 in a 0700 directory). Several servers on one etcd must be given
//! the same KEK file. See `docs/security.md` ("Variables and the keyring") for why this
//! and not Nomad's key replication between servers.
//!
//! A variable's items are encrypted with the active root key; the ciphertext is stored
//! with the key's id and a fresh random 96-bit nonce, and the variable's namespace and
//! path are the associated data: a ciphertext copied to another path does not decrypt.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use aes_gcm::aead::{Aead, KeyInit, OsRng, Payload};
use aes_gcm::{AeadCore, Aes256Gcm, Key, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use drover_server_api::Index;
use drover_server_api::variables::{RootKeyMeta, WorkloadClaims};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

/// Nomad's name of the one algorithm.
pub const ALGORITHM: &str = "aes256-gcm";
/// A root key that new encryptions use.
pub const ACTIVE: &str = "active";
/// A root key kept to decrypt and verify.
pub const INACTIVE: &str = "inactive";

const NONCE_BYTES: usize = 12;
const KEY_BYTES: usize = 32;

/// The KEK file's name in the keystore directory of a server not given one.
pub const DEFAULT_KEK_FILE: &str = "kek";
/// The directory of the data dir that holds the generated KEK.
pub const KEYSTORE_DIR: &str = "keystore";

/// Why a keyring operation failed. Messages never hold key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    /// The KEK file cannot be read, written or used.
    #[error("keyring KEK file {path}: {reason}")]
    KekFile {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A root key does not unwrap with this server's KEK (the servers were given
    /// different KEK files), or a stored key is malformed.
    #[error("root key {id}: {reason}")]
    RootKey {
        /// The key's id.
        id: String,
        /// Why.
        reason: String,
    },
    /// A ciphertext does not decrypt: another key, another path, or tampered with.
    #[error("cannot decrypt: {0}")]
    Decrypt(String),
    /// Encryption or signing failed.
    #[error("{0}")]
    Crypto(String),
}

/// A root key as the store keeps it: metadata in clear, material wrapped by the KEK.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRootKey {
    /// The metadata (what `/v1/operator/keyring/keys` serves).
    pub meta: RootKeyMeta,
    /// Base64 of nonce (12 bytes) then AES-256-GCM of the key under the KEK, with
    /// `drover/rootkey/<id>` as associated data.
    pub wrapped: String,
}

/// Unwrapped key material of one root key, with what is derived from it.
struct Material {
    aes: Zeroizing<[u8; KEY_BYTES]>,
    /// PKCS#8 of the Ed25519 signing key derived from the root key.
    signing_pkcs8: Zeroizing<Vec<u8>>,
    /// The Ed25519 public key (raw 32 bytes).
    public: Vec<u8>,
}

/// The KEK and the root keys unwrapped so far.
pub struct Keyring {
    kek: Zeroizing<[u8; KEY_BYTES]>,
    cache: Mutex<HashMap<String, Arc<Material>>>,
    /// Root keys that did not unwrap, each logged once (a server given another KEK
    /// than its peers would say so at every allocation it sends).
    refused: Mutex<std::collections::HashSet<String>>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keyring { .. }")
    }
}

fn kek_error(path: &Path, reason: impl std::fmt::Display) -> KeyringError {
    KeyringError::KekFile {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

impl Keyring {
    /// A keyring with `kek` as its KEK (tests).
    pub fn with_kek(kek: [u8; KEY_BYTES]) -> Keyring {
        Keyring {
            kek: Zeroizing::new(kek),
            cache: Mutex::new(HashMap::new()),
            refused: Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// The KEK in `file` (base64 of 32 bytes). `generate`: when the file does not
    /// exist, make one (0600; its directory 0700 when it had to be created) — what a
    /// single server does in its data dir; a KEK the operator names must exist.
    pub fn open(file: &Path, generate: bool) -> Result<Keyring, KeyringError> {
        use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
        match std::fs::read_to_string(file) {
            Ok(text) => {
                let meta = std::fs::metadata(file).map_err(|e| kek_error(file, e))?;
                if meta.permissions().mode() & 0o077 != 0 {
                    return Err(kek_error(
                        file,
                        format!(
                            "readable by others (mode {:o}): chmod 600 it",
                            meta.permissions().mode() & 0o777
                        ),
                    ));
                }
                let bytes = Zeroizing::new(
                    B64.decode(text.trim())
                        .map_err(|_| kek_error(file, "not base64 of 32 bytes"))?,
                );
                let kek: [u8; KEY_BYTES] = bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| kek_error(file, "not base64 of 32 bytes"))?;
                Ok(Keyring::with_kek(kek))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && generate => {
                if let Some(dir) = file.parent()
                    && !dir.exists()
                {
                    std::fs::create_dir_all(dir).map_err(|e| kek_error(file, e))?;
                    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                        .map_err(|e| kek_error(file, e))?;
                }
                let key = Aes256Gcm::generate_key(OsRng);
                let mut kek = [0u8; KEY_BYTES];
                kek.copy_from_slice(&key);
                let text = Zeroizing::new(B64.encode(kek));
                // create_new: never through a link planted in its place.
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(file)
                    .map_err(|e| kek_error(file, e))?;
                f.write_all(text.as_bytes())
                    .and_then(|()| f.write_all(b"\n"))
                    .and_then(|()| f.sync_all())
                    .map_err(|e| kek_error(file, e))?;
                tracing::info!(file = %file.display(), "generated the keyring's key-encryption key");
                Ok(Keyring::with_kek(kek))
            }
            Err(e) => Err(kek_error(file, e)),
        }
    }

    /// A new root key, wrapped, in `state`, created by the commit at `index`.
    pub fn new_root_key(
        &self,
        state: &str,
        index: Index,
        now: i64,
    ) -> Result<StoredRootKey, KeyringError> {
        let id = uuid::Uuid::new_v4().to_string();
        let key = Aes256Gcm::generate_key(OsRng);
        let wrapped = seal(
            &self.kek,
            key.as_slice(),
            format!("drover/rootkey/{id}").as_bytes(),
        )?;
        Ok(StoredRootKey {
            meta: RootKeyMeta {
                key_id: id,
                algorithm: ALGORITHM.into(),
                create_time: now,
                create_index: index,
                modify_index: index,
                state: state.into(),
            },
            wrapped,
        })
    }

    fn material(&self, key: &StoredRootKey) -> Result<Arc<Material>, KeyringError> {
        let id = &key.meta.key_id;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = cache.get(id) {
            return Ok(m.clone());
        }
        let raw = open(
            &self.kek,
            &key.wrapped,
            format!("drover/rootkey/{id}").as_bytes(),
        )
        .map_err(|_| {
            let e = KeyringError::RootKey {
                id: id.clone(),
                reason: "does not unwrap with this server's KEK (every server must be given \
                         the same --keyring-kek-file)"
                    .into(),
            };
            if self
                .refused
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id.clone())
            {
                tracing::warn!(
                    "{e}: variables it encrypted cannot be read here, and no \
                                workload identity is signed here"
                );
            }
            e
        })?;
        let mut aes = Zeroizing::new([0u8; KEY_BYTES]);
        if raw.len() != KEY_BYTES {
            return Err(KeyringError::RootKey {
                id: id.clone(),
                reason: "not 32 bytes".into(),
            });
        }
        aes.copy_from_slice(&raw);
        // The signing key is derived, not stored: one secret per root key to keep.
        let mut seed = Zeroizing::new([0u8; KEY_BYTES]);
        {
            use sha2::Digest as _;
            let mut h = sha2::Sha256::new();
            h.update(b"drover workload identity signing key v1\0");
            h.update(aes.as_slice());
            seed.copy_from_slice(&h.finalize());
        }
        let pair = aws_lc_rs::signature::Ed25519KeyPair::from_seed_unchecked(seed.as_slice())
            .map_err(|e| KeyringError::Crypto(format!("signing key of {id}: {e}")))?;
        let signing_pkcs8 = Zeroizing::new(
            pair.to_pkcs8()
                .map_err(|_| KeyringError::Crypto(format!("signing key of {id}")))?
                .as_ref()
                .to_vec(),
        );
        let public = {
            use aws_lc_rs::signature::KeyPair as _;
            pair.public_key().as_ref().to_vec()
        };
        let m = Arc::new(Material {
            aes,
            signing_pkcs8,
            public,
        });
        cache.insert(id.clone(), m.clone());
        Ok(m)
    }

    /// Encrypt `plaintext` (a variable's items) with `key` for `namespace`/`path`.
    pub fn encrypt(
        &self,
        key: &StoredRootKey,
        namespace: &str,
        path: &str,
        plaintext: &[u8],
    ) -> Result<String, KeyringError> {
        let m = self.material(key)?;
        seal(&m.aes, plaintext, &variable_aad(namespace, path))
    }

    /// Decrypt what [`Keyring::encrypt`] made with `key` for `namespace`/`path`.
    pub fn decrypt(
        &self,
        key: &StoredRootKey,
        namespace: &str,
        path: &str,
        data: &str,
    ) -> Result<Zeroizing<Vec<u8>>, KeyringError> {
        let m = self.material(key)?;
        open(&m.aes, data, &variable_aad(namespace, path))
    }

    /// Sign a workload identity with `key` (EdDSA, `kid` = the key's id).
    pub fn sign_identity(
        &self,
        key: &StoredRootKey,
        claims: &WorkloadClaims,
    ) -> Result<String, KeyringError> {
        let m = self.material(key)?;
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some(key.meta.key_id.clone());
        let enc = jsonwebtoken::EncodingKey::from_ed_der(&m.signing_pkcs8);
        jsonwebtoken::encode(&header, claims, &enc)
            .map_err(|e| KeyringError::Crypto(format!("cannot sign a workload identity: {e}")))
    }

    /// Verify a workload identity against the root keys `keys` (by its `kid`): its
    /// claims when the signature holds.
    pub fn verify_identity<'a>(
        &self,
        token: &str,
        key_of: impl Fn(&str) -> Option<&'a StoredRootKey>,
    ) -> Result<WorkloadClaims, String> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| format!("not a JWT: {e}"))?;
        if header.alg != jsonwebtoken::Algorithm::EdDSA {
            return Err(format!("algorithm {:?} is not EdDSA", header.alg));
        }
        let kid = header.kid.ok_or("no key id (kid)")?;
        let key = key_of(&kid).ok_or_else(|| format!("unknown key id {kid:?}"))?;
        let m = self.material(key).map_err(|e| e.to_string())?;
        let dec = jsonwebtoken::DecodingKey::from_ed_der(&m.public);
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::EdDSA);
        // Nomad 1.6's workload identities carry no expiry: they live as long as their
        // allocation, which the server checks on every use.
        validation.required_spec_claims.clear();
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        jsonwebtoken::decode::<WorkloadClaims>(token, &dec, &validation)
            .map(|d| d.claims)
            .map_err(|e| format!("invalid signature or claims: {e}"))
    }

    /// The public key (raw Ed25519) of `key`, for `/.well-known/jwks.json`.
    pub fn public_key(&self, key: &StoredRootKey) -> Result<Vec<u8>, KeyringError> {
        Ok(self.material(key)?.public.clone())
    }

    /// The JSON Web Key Set of `keys` (Nomad's `/.well-known/jwks.json`): the public
    /// key that verifies each one's workload identities, `kid` its key id. Inactive
    /// keys are in it (what they signed is still valid); a key that does not unwrap
    /// here (another KEK) is left out, and was logged when first refused.
    pub fn jwks<'a>(&self, keys: impl IntoIterator<Item = &'a StoredRootKey>) -> JwkSet {
        let keys = keys
            .into_iter()
            .filter_map(|k| {
                let public = self.public_key(k).ok()?;
                Some(Jwk {
                    kty: "OKP".into(),
                    crv: "Ed25519".into(),
                    alg: "EdDSA".into(),
                    key_use: "sig".into(),
                    kid: k.meta.key_id.clone(),
                    x: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(public),
                })
            })
            .collect();
        JwkSet { keys }
    }
}

/// A JSON Web Key Set (RFC 7517), as `/.well-known/jwks.json` serves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JwkSet {
    /// The keys.
    pub keys: Vec<Jwk>,
}

/// An Ed25519 public key as a JSON Web Key (RFC 8037: `OKP`, `crv` Ed25519, `x` the
/// raw key in base64url without padding).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwk {
    /// `OKP`.
    pub kty: String,
    /// `Ed25519`.
    pub crv: String,
    /// `EdDSA`.
    pub alg: String,
    /// `sig`.
    #[serde(rename = "use")]
    pub key_use: String,
    /// The root key's id: the `kid` of the identities it signed.
    pub kid: String,
    /// The public key.
    pub x: String,
}

/// The associated data of a variable's ciphertext: where it belongs.
fn variable_aad(namespace: &str, path: &str) -> Vec<u8> {
    format!("drover/var/v1\0{namespace}\0{path}").into_bytes()
}

/// Base64 of a fresh nonce followed by AES-256-GCM of `plaintext` under `key`.
fn seal(key: &[u8; KEY_BYTES], plaintext: &[u8], aad: &[u8]) -> Result<String, KeyringError> {
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key));
    let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
    let ct = cipher
        .encrypt(
            &nonce,
            Payload {
                msg: plaintext,
                aad,
            },
        )
        .map_err(|_| KeyringError::Crypto("encryption failed".into()))?;
    let mut out = Vec::with_capacity(NONCE_BYTES + ct.len());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&ct);
    Ok(B64.encode(out))
}

/// What [`seal`] made, opened.
fn open(key: &[u8; KEY_BYTES], data: &str, aad: &[u8]) -> Result<Zeroizing<Vec<u8>>, KeyringError> {
    let raw = B64
        .decode(data)
        .map_err(|_| KeyringError::Decrypt("not base64".into()))?;
    if raw.len() < NONCE_BYTES + 16 {
        return Err(KeyringError::Decrypt("too short".into()));
    }
    let (nonce, ct) = raw.split_at(NONCE_BYTES);
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key));
    cipher
        .decrypt(Nonce::from_slice(nonce), Payload { msg: ct, aad })
        .map(Zeroizing::new)
        .map_err(|_| {
            KeyringError::Decrypt(
                "authentication failed (another key, another path, or altered)".into(),
            )
        })
}

/// Where a server keeps its KEK when not told: `<data_dir>/keystore/kek`.
pub fn default_kek_file(data_dir: &Path) -> PathBuf {
    data_dir.join(KEYSTORE_DIR).join(DEFAULT_KEK_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Keyring {
        Keyring::with_kek([7; 32])
    }

    #[test]
    fn a_variable_round_trips_and_its_ciphertext_holds_no_plaintext() {
        let k = ring();
        let key = k.new_root_key(ACTIVE, 1, 0).unwrap();
        let ct = k.encrypt(&key, "default", "a/b", b"marker-1234").unwrap();
        assert!(!ct.contains("marker"));
        let raw = B64.decode(&ct).unwrap();
        assert!(!raw.windows(6).any(|w| w == b"marker"));
        assert_eq!(
            k.decrypt(&key, "default", "a/b", &ct).unwrap().as_slice(),
            b"marker-1234"
        );
        // A fresh nonce every time.
        assert_ne!(
            ct,
            k.encrypt(&key, "default", "a/b", b"marker-1234").unwrap()
        );
        // The wrapped key is not the key.
        assert!(!key.wrapped.is_empty());
    }

    #[test]
    fn another_key_another_path_or_another_kek_does_not_decrypt() {
        let k = ring();
        let key = k.new_root_key(ACTIVE, 1, 0).unwrap();
        let other = k.new_root_key(ACTIVE, 2, 0).unwrap();
        let ct = k.encrypt(&key, "default", "a/b", b"secret").unwrap();
        assert!(k.decrypt(&other, "default", "a/b", &ct).is_err());
        assert!(k.decrypt(&key, "default", "a/c", &ct).is_err());
        assert!(k.decrypt(&key, "other", "a/b", &ct).is_err());
        let mut tampered = B64.decode(&ct).unwrap();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(
            k.decrypt(&key, "default", "a/b", &B64.encode(tampered))
                .is_err()
        );
        // A server with another KEK cannot unwrap the root key.
        let err = Keyring::with_kek([8; 32])
            .decrypt(&key, "default", "a/b", &ct)
            .unwrap_err()
            .to_string();
        assert!(err.contains("KEK"), "{err}");
    }

    #[test]
    fn identities_verify_with_their_key_only() {
        let k = ring();
        let key = k.new_root_key(ACTIVE, 1, 0).unwrap();
        let other = k.new_root_key(ACTIVE, 2, 0).unwrap();
        let claims = WorkloadClaims {
            nomad_namespace: "default".into(),
            nomad_job_id: "web".into(),
            nomad_allocation_id: "a1".into(),
            nomad_task: "t".into(),
            sub: "a1".into(),
            iat: 5,
        };
        let token = k.sign_identity(&key, &claims).unwrap();
        assert_eq!(token.split('.').count(), 3);
        let got = k
            .verify_identity(&token, |id| (id == key.meta.key_id).then_some(&key))
            .unwrap();
        assert_eq!(got, claims);
        // Deterministic (Ed25519): the same claims make the same token.
        assert_eq!(token, k.sign_identity(&key, &claims).unwrap());
        // Under another key's id, the signature does not hold.
        assert!(k.verify_identity(&token, |_| Some(&other)).is_err());
        assert!(k.verify_identity(&token, |_| None).is_err());
        // Claims changed after signing.
        let parts: Vec<&str> = token.split('.').collect();
        let forged_claims = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(
            serde_json::to_vec(&WorkloadClaims {
                nomad_job_id: "db".into(),
                ..claims
            })
            .unwrap(),
        );
        let forged = format!("{}.{forged_claims}.{}", parts[0], parts[2]);
        assert!(k.verify_identity(&forged, |_| Some(&key)).is_err());
    }

    #[test]
    fn the_jwks_verifies_each_keys_identities_by_kid_and_nothing_else() {
        let k = ring();
        let old = k.new_root_key(INACTIVE, 1, 0).unwrap();
        let active = k.new_root_key(ACTIVE, 2, 0).unwrap();
        let foreign = Keyring::with_kek([9; 32])
            .new_root_key(ACTIVE, 3, 0)
            .unwrap();
        let set = k.jwks([&old, &active, &foreign]);
        // The key this server cannot unwrap is left out.
        let kids: Vec<&str> = set.keys.iter().map(|j| j.kid.as_str()).collect();
        assert_eq!(
            kids,
            [old.meta.key_id.as_str(), active.meta.key_id.as_str()]
        );
        // What a JWT library reads from the served JSON verifies the identities.
        let text = serde_json::to_string(&set).unwrap();
        assert!(!text.contains("\"d\""), "no private part: {text}");
        let parsed: jsonwebtoken::jwk::JwkSet = serde_json::from_str(&text).unwrap();
        let claims = WorkloadClaims {
            nomad_namespace: "default".into(),
            nomad_job_id: "web".into(),
            nomad_allocation_id: "a1".into(),
            nomad_task: "t".into(),
            sub: "a1".into(),
            iat: 5,
        };
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::EdDSA);
        validation.required_spec_claims.clear();
        validation.validate_exp = false;
        for key in [&old, &active] {
            let token = k.sign_identity(key, &claims).unwrap();
            let kid = jsonwebtoken::decode_header(&token).unwrap().kid.unwrap();
            let jwk = parsed.find(&kid).expect("the token's kid is served");
            let dec = jsonwebtoken::DecodingKey::from_jwk(jwk).unwrap();
            let got = jsonwebtoken::decode::<WorkloadClaims>(&token, &dec, &validation).unwrap();
            assert_eq!(got.claims, claims);
            // The other served key does not verify it.
            let other = parsed
                .keys
                .iter()
                .find(|j| j.common.key_id.as_deref() != Some(&kid))
                .unwrap();
            let dec = jsonwebtoken::DecodingKey::from_jwk(other).unwrap();
            assert!(jsonwebtoken::decode::<WorkloadClaims>(&token, &dec, &validation).is_err());
        }
    }

    #[test]
    fn a_generated_kek_is_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let file = default_kek_file(dir.path());
        let k = Keyring::open(&file, true).unwrap();
        let key = k.new_root_key(ACTIVE, 1, 0).unwrap();
        let ct = k.encrypt(&key, "default", "p", b"v").unwrap();
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::metadata(file.parent().unwrap())
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        let again = Keyring::open(&file, false).unwrap();
        assert_eq!(
            again.decrypt(&key, "default", "p", &ct).unwrap().as_slice(),
            b"v"
        );
        // Named but missing: an error, never a new key.
        let err = Keyring::open(&dir.path().join("none"), false).unwrap_err();
        assert!(err.to_string().contains("none"), "{err}");
        // Readable by others: refused.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            Keyring::open(&file, false)
                .unwrap_err()
                .to_string()
                .contains("chmod")
        );
    }
}
