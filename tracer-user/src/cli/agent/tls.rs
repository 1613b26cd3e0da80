//! `--tls-cert`/`--tls-key`: the agent's HTTP endpoints over TLS (rustls,
//! the ring provider; TLS 1.2 and 1.3, HTTP/1.1 by ALPN). Both files are
//! PEM: the certificate chain (leaf first) and its private key (PKCS#8,
//! PKCS#1 or SEC1), read once at start. A key file that group or others
//! may read is refused, as the token file is (`private_file`).

use std::{path::{Path, PathBuf}, sync::Arc};

use rustls::pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read a PEM certificate chain from {path}: {source}")]
    Cert { path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("{path} holds no certificate")]
    NoCert { path: PathBuf },
    #[error("cannot read a PEM private key from {path}: {source}")]
    Key { path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error(transparent)]
    KeyFile(#[from] super::private_file::PrivateFileError),
    #[error("the certificate and key are not usable together: {0}")]
    Config(#[from] rustls::Error),
}

/// The largest key file read (a PEM RSA-8192 key is about 6.5 KB).
const MAX_KEY_BYTES: u64 = 64 * 1024;

/// The server configuration for `cert` and `key`.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Cert { path: cert.to_owned(), source })?;
    if chain.is_empty() {
        return Err(TlsError::NoCert { path: cert.to_owned() });
    }
    let raw = super::private_file::read("TLS key file", key, MAX_KEY_BYTES)?;
    let key = PrivateKeyDer::from_pem_slice(&raw).map_err(|source| TlsError::Key { path: key.to_owned(), source })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
