//! A task's own certificate authority: the proxy shows a certificate it
//! signs for each host it intercepts, and only that task's sandbox trusts
//! it. Its private key stays with the daemon.
//!
//! The CA certificate is made once, at task creation, and kept (the
//! sandbox trusts exactly that certificate across suspends and restarts).
//! Leaves are made by the proxy on demand, one per host, and cached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;

use crate::{Error, Host, Result};

/// How long a task's CA certificate is valid: longer than any task lives.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a leaf is valid; a proxy makes new ones when it starts.
const LEAF_VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);
/// Clock skew allowed for (a sandbox's clock is the host's, but a
/// restored snapshot may run a moment behind).
const SKEW: Duration = Duration::from_secs(24 * 3600);

/// The certificate and key of a task's CA, as PEM.
#[derive(Clone)]
pub struct CaPem {
    pub cert: String,
    pub key: String,
}

impl std::fmt::Debug for CaPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaPem").field("cert", &self.cert).finish_non_exhaustive()
    }
}

fn ca_params(task: &str, not_before: SystemTime) -> Result<CertificateParams> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Cairn");
    dn.push(DnType::CommonName, format!("Cairn egress CA for task {task}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_before = not_before.into();
    params.not_after = (not_before + CA_VALIDITY).into();
    Ok(params)
}

fn tls(e: impl std::fmt::Display) -> Error {
    Error::Tls(e.to_string())
}

/// Makes a new CA for `task`.
pub fn generate(task: &str) -> Result<CaPem> {
    let key = KeyPair::generate().map_err(tls)?;
    let cert = ca_params(task, SystemTime::now() - SKEW)?.self_signed(&key).map_err(tls)?;
    Ok(CaPem { cert: cert.pem(), key: key.serialize_pem() })
}

/// A task's CA, ready to sign leaves.
pub struct TaskCa {
    issuer: rcgen::Certificate,
    key: KeyPair,
    /// The CA certificate as stored (what the sandbox trusts).
    cert_pem: String,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl std::fmt::Debug for TaskCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskCa").field("cert", &self.cert_pem).finish_non_exhaustive()
    }
}

impl TaskCa {
    /// The CA of `task` from its stored PEM. Leaves name the issuer by
    /// subject and key, which are the same in a certificate made again
    /// from the same key, so the stored certificate is only handed out.
    pub fn load(task: &str, pem: &CaPem) -> Result<TaskCa> {
        let key = KeyPair::from_pem(&pem.key).map_err(tls)?;
        let issuer = ca_params(task, SystemTime::now() - SKEW)?.self_signed(&key).map_err(tls)?;
        Ok(TaskCa {
            issuer,
            key,
            cert_pem: pem.cert.clone(),
            leaves: Mutex::new(HashMap::new()),
            provider: Arc::new(rustls::crypto::ring::default_provider()),
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A TLS server configuration presenting a certificate for `host`,
    /// offering HTTP/2 and HTTP/1.1.
    pub fn server_config(&self, host: &Host) -> Result<Arc<ServerConfig>> {
        let mut leaves = self.leaves.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = leaves.get(host.as_str()) {
            return Ok(c.clone());
        }
        let key = KeyPair::generate().map_err(tls)?;
        let mut params = CertificateParams::new(vec![host.as_str().to_owned()]).map_err(tls)?;
        params.distinguished_name.push(DnType::CommonName, host.as_str());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = SystemTime::now();
        params.not_before = (now - SKEW).into();
        params.not_after = (now + LEAF_VALIDITY).into();
        params.use_authority_key_identifier_extension = true;
        let leaf = params.signed_by(&key, &self.issuer, &self.key).map_err(tls)?;
        let chain = vec![leaf.der().clone(), CertificateDer::from_pem_slice(self.cert_pem.as_bytes()).map_err(tls)?];
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(tls)?
            .with_no_client_auth()
            .with_single_cert(chain, PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())))
            .map_err(tls)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let config = Arc::new(config);
        leaves.insert(host.as_str().to_owned(), config.clone());
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_ca_loads_and_signs_leaves_its_certificate_verifies() {
        let pem = generate("t-1").unwrap();
        assert!(pem.cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(!format!("{pem:?}").contains("PRIVATE KEY"), "the key is not in the debug form");
        let ca = TaskCa::load("t-1", &pem).unwrap();
        let host = Host::parse("api.example.com").unwrap();
        let config = ca.server_config(&host).unwrap();
        assert!(Arc::ptr_eq(&config, &ca.server_config(&host).unwrap()), "cached");
        // The leaf verifies against the stored CA certificate alone.
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(pem.cert.as_bytes()).unwrap()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), ca.provider.clone()).build().unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["api.example.com".to_owned()]).unwrap();
        params.use_authority_key_identifier_extension = true;
        let leaf = params.signed_by(&key, &ca.issuer, &ca.key).unwrap();
        let name = rustls::pki_types::ServerName::try_from("api.example.com").unwrap();
        let now = rustls::pki_types::UnixTime::now();
        use rustls::client::danger::ServerCertVerifier;
        verifier.verify_server_cert(leaf.der(), &[], &name, &[], now).unwrap();
        let other = rustls::pki_types::ServerName::try_from("other.example.com").unwrap();
        assert!(verifier.verify_server_cert(leaf.der(), &[], &other, &[], now).is_err(), "only for its host");
        // Another task's CA does not vouch for it.
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(generate("t-2").unwrap().cert.as_bytes()).unwrap()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), ca.provider.clone()).build().unwrap();
        assert!(verifier.verify_server_cert(leaf.der(), &[], &name, &[], now).is_err());
    }
}
