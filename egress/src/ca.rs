//! The local certificate authority: generating it (P-256, CA:TRUE and
//! keyCertSign both critical, ten years) and minting a leaf for each name a
//! sandbox connects to (P-256, authority key identifier, serverAuth,
//! backdated not-before, served as the chain [leaf, CA]). Leaves are cached
//! by name, minted once however many connections ask at the same moment,
//! in a cache of bounded size.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SerialNumber,
};
use rustls::ServerConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;
use zeroize::Zeroizing;

use crate::policy::Host;

/// The CA's lifetime.
const CA_VALIDITY: time::Duration = time::Duration::days(3650);
/// How long before "now" a certificate's validity starts, for clocks that lag.
const BACKDATE: time::Duration = time::Duration::days(1);
/// A leaf's lifetime; the cache mints a new one long before it ends.
const LEAF_VALIDITY: time::Duration = time::Duration::days(7);
/// How long a cached leaf is served.
const LEAF_REFRESH: Duration = Duration::from_secs(24 * 3600);
/// How many names keep their leaf in the cache.
pub const LEAF_CACHE_SIZE: usize = 512;
/// The common name of the CA, also how a person finds it in a trust store.
pub const CA_NAME: &str = "hermes egress proxy CA";

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("the CA certificate or key could not be read: {0}")]
    Parse(rcgen::Error),
    #[error("the CA key does not belong to the CA certificate")]
    KeyMismatch,
    #[error("minting a certificate failed: {0}")]
    Mint(rcgen::Error),
    #[error("the TLS configuration was refused: {0}")]
    Tls(#[from] rustls::Error),
}

/// A newly generated CA, as the files that hold it.
#[derive(Debug)]
pub struct NewCa {
    pub cert_pem: String,
    pub key_pem: Zeroizing<String>,
}

/// Generates a CA: P-256, CA:TRUE and keyCertSign critical, ten years
/// from a day ago.
pub fn generate() -> Result<NewCa, CaError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(CaError::Mint)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_NAME);
    dn.push(DnType::OrganizationName, "hermes");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + CA_VALIDITY;
    params.serial_number = Some(random_serial());
    let cert = params.self_signed(&key).map_err(CaError::Mint)?;
    Ok(NewCa {
        cert_pem: cert.pem(),
        key_pem: Zeroizing::new(key.serialize_pem()),
    })
}

fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    // A failing system random source leaves the bytes zero; serials need
    // only be unique per CA, and the leaf keys do not come from here.
    let _ = getrandom::fill(&mut bytes);
    bytes[0] &= 0x7f; // positive
    SerialNumber::from_slice(&bytes)
}

/// A loaded CA that mints leaves.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// Loads `ca.crt` and `ca.key` (PEM), checking that they belong together.
    pub fn load(cert_pem: &str, key_pem: &str) -> Result<Ca, CaError> {
        let key = KeyPair::from_pem(key_pem).map_err(CaError::Parse)?;
        let der = rustls_pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .map_err(|_| CaError::Parse(rcgen::Error::CouldNotParseCertificate))?;
        let cert_der: CertificateDer<'static> = der;
        if x509_key_bits(&cert_der).as_deref() != Some(rcgen::PublicKeyData::der_bytes(&key)) {
            return Err(CaError::KeyMismatch);
        }
        let issuer = Issuer::from_ca_cert_der(&cert_der, key).map_err(CaError::Parse)?;
        Ok(Ca { issuer, cert_der })
    }

    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Mints a leaf for `host`: the chain [leaf, CA] and the leaf's key.
    pub fn mint(
        &self,
        host: &Host,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), CaError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(CaError::Mint)?;
        let name = host.to_string();
        let mut params = CertificateParams::new(vec![name.clone()]).map_err(CaError::Mint)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + LEAF_VALIDITY;
        params.serial_number = Some(random_serial());
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(CaError::Mint)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((vec![cert.der().clone(), self.cert_der.clone()], key_der))
    }
}

/// The public key bits of a certificate, found with the parser rcgen
/// already uses.
fn x509_key_bits(der: &CertificateDer<'_>) -> Option<Vec<u8>> {
    use x509_parser::prelude::FromDer;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
    Some(cert.public_key().subject_public_key.data.to_vec())
}

/// `provider` with its TLS 1.3 suites in the order the proxy picks them
/// for a sandbox's connection: AES-128-GCM-SHA256 first. Every suite stays
/// offered; the sandbox's link is the host's own network, where 128-bit
/// keys are ample, and SHA-256 (with the CPU's SHA extensions) makes a
/// new connection's key schedule several times cheaper than SHA-384 (the
/// first choice of most clients), the one step of a handshake the proxy
/// can make cheaper.
pub fn sandbox_facing(provider: &rustls::crypto::CryptoProvider) -> rustls::crypto::CryptoProvider {
    let mut provider = provider.clone();
    provider
        .cipher_suites
        .sort_by_key(|suite| match suite.suite() {
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => 0,
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => 1,
            rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => 2,
            _ => 3,
        });
    provider
}

/// TLS server configurations for the names sandboxes connect to, one leaf
/// per name: minted on first use (once, however many connections wait for
/// it), served for a day, at most [`LEAF_CACHE_SIZE`] names kept.
pub struct LeafCache {
    ca: Arc<Ca>,
    cache: quick_cache::sync::Cache<Host, (Instant, Arc<ServerConfig>)>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl std::fmt::Debug for LeafCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeafCache")
            .field("len", &self.cache.len())
            .finish_non_exhaustive()
    }
}

impl LeafCache {
    /// The leaves of `ca`, served with `provider`'s primitives in the
    /// order of [`sandbox_facing`].
    pub fn new(ca: Arc<Ca>, provider: Arc<rustls::crypto::CryptoProvider>) -> LeafCache {
        LeafCache {
            ca,
            cache: quick_cache::sync::Cache::new(LEAF_CACHE_SIZE),
            provider: Arc::new(sandbox_facing(&provider)),
        }
    }

    /// The server configuration for `host`, minting its leaf if needed.
    pub async fn server_config(&self, host: &Host) -> Result<Arc<ServerConfig>, CaError> {
        if let Some((minted, config)) = self.cache.get(host) {
            if minted.elapsed() < LEAF_REFRESH {
                return Ok(config);
            }
            self.cache.remove(host);
        }
        let (_, config) = self
            .cache
            .get_or_insert_async(host, async {
                let (chain, key) = self.ca.mint(host)?;
                let mut config = ServerConfig::builder_with_provider(self.provider.clone())
                    .with_safe_default_protocol_versions()?
                    .with_no_client_auth()
                    .with_single_cert(chain, key)?;
                config.alpn_protocols = vec![b"http/1.1".to_vec()];
                // The proxy's order of cipher suites, not the client's:
                // AES-128-GCM with SHA-256 first (see [`sandbox_facing`]).
                config.ignore_client_order = true;
                Ok::<_, CaError>((Instant::now(), Arc::new(config)))
            })
            .await?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use x509_parser::prelude::*;

    #[test]
    fn a_new_ca_is_a_critical_ca_with_key_cert_sign_for_ten_years() {
        let new = generate().unwrap();
        let ca = Ca::load(&new.cert_pem, &new.key_pem).unwrap();
        let (_, cert) = X509Certificate::from_der(ca.cert_der()).unwrap();
        let bc = cert.basic_constraints().unwrap().unwrap();
        assert!(bc.critical && bc.value.ca);
        let ku = cert.key_usage().unwrap().unwrap();
        assert!(ku.critical && ku.value.key_cert_sign());
        let days = (cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp())
            / 86_400;
        assert_eq!(days, 3650 + 1);
        assert!(
            cert.validity().not_before.timestamp() < OffsetDateTime::now_utc().unix_timestamp()
        );
    }

    #[test]
    fn a_leaf_names_its_host_serves_server_auth_and_chains_to_the_ca() {
        let new = generate().unwrap();
        let ca = Ca::load(&new.cert_pem, &new.key_pem).unwrap();
        let (chain, _) = ca.mint(&Host::Name("api.openai.com".into())).unwrap();
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1], *ca.cert_der());
        let (_, leaf) = X509Certificate::from_der(&chain[0]).unwrap();
        let (_, root) = X509Certificate::from_der(&chain[1]).unwrap();
        assert_eq!(leaf.issuer(), root.subject());
        let san = leaf.subject_alternative_name().unwrap().unwrap();
        assert_eq!(
            san.value.general_names,
            vec![GeneralName::DNSName("api.openai.com")]
        );
        let eku = leaf.extended_key_usage().unwrap().unwrap();
        assert!(eku.value.server_auth);
        let aki = leaf
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::AuthorityKeyIdentifier(aki) => Some(aki.clone()),
                _ => None,
            })
            .unwrap();
        let ski = root
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(ski) => Some(ski.0.to_vec()),
                _ => None,
            })
            .unwrap();
        assert_eq!(aki.key_identifier.unwrap().0.to_vec(), ski);
        assert!(
            leaf.validity().not_before.timestamp()
                < OffsetDateTime::now_utc().unix_timestamp() - 3600
        );
        assert!(leaf.verify_signature(Some(root.public_key())).is_ok());
        assert_eq!(
            leaf.public_key().algorithm.algorithm,
            x509_parser::oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY
        );
    }

    #[test]
    fn a_key_of_another_ca_is_refused() {
        let one = generate().unwrap();
        let two = generate().unwrap();
        assert!(matches!(
            Ca::load(&one.cert_pem, &two.key_pem),
            Err(CaError::KeyMismatch)
        ));
    }

    #[tokio::test]
    async fn concurrent_requests_for_one_name_share_one_leaf() {
        let new = generate().unwrap();
        let ca = Arc::new(Ca::load(&new.cert_pem, &new.key_pem).unwrap());
        let cache = Arc::new(LeafCache::new(
            ca,
            Arc::new(rustls::crypto::ring::default_provider()),
        ));
        let host = Host::Name("api.anthropic.com".into());
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let cache = cache.clone();
                let host = host.clone();
                tokio::spawn(async move { cache.server_config(&host).await.unwrap() })
            })
            .collect();
        let mut configs = Vec::new();
        for t in tasks {
            configs.push(t.await.unwrap());
        }
        assert!(configs.iter().all(|c| Arc::ptr_eq(c, &configs[0])));
    }

    /// A client that prefers AES-256-GCM-SHA384 (rustls's default order,
    /// and most clients') gets AES-128-GCM-SHA256 from the proxy; one that
    /// offers only AES-256 still gets it.
    #[tokio::test]
    async fn the_proxy_picks_aes_128_with_sha_256_whatever_the_clients_order() {
        let new = generate().unwrap();
        let ca = Arc::new(Ca::load(&new.cert_pem, &new.key_pem).unwrap());
        let provider = rustls::crypto::ring::default_provider();
        let cache = LeafCache::new(ca.clone(), Arc::new(provider.clone()));
        let host = Host::Name("api.openai.com".into());
        let server = cache.server_config(&host).await.unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der().clone()).unwrap();
        for (offered, expected) in [
            (
                provider.cipher_suites.clone(),
                rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
            ),
            (
                provider
                    .cipher_suites
                    .iter()
                    .filter(|s| s.suite() == rustls::CipherSuite::TLS13_AES_256_GCM_SHA384)
                    .copied()
                    .collect(),
                rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
            ),
        ] {
            assert_eq!(
                offered[0].suite(),
                rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
                "the client prefers AES-256"
            );
            let client_provider = rustls::crypto::CryptoProvider {
                cipher_suites: offered,
                ..provider.clone()
            };
            let client = rustls::ClientConfig::builder_with_provider(Arc::new(client_provider))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots.clone())
                .with_no_client_auth();
            let mut c = rustls::ClientConnection::new(
                Arc::new(client),
                rustls_pki_types::ServerName::try_from("api.openai.com").unwrap(),
            )
            .unwrap();
            let mut s = rustls::ServerConnection::new(server.clone()).unwrap();
            for _ in 0..10 {
                let mut buf = Vec::new();
                while c.wants_write() {
                    c.write_tls(&mut buf).unwrap();
                }
                s.read_tls(&mut buf.as_slice()).unwrap();
                s.process_new_packets().unwrap();
                let mut back = Vec::new();
                while s.wants_write() {
                    s.write_tls(&mut back).unwrap();
                }
                c.read_tls(&mut back.as_slice()).unwrap();
                c.process_new_packets().unwrap();
                if !c.is_handshaking() && !s.is_handshaking() {
                    break;
                }
            }
            assert!(!c.is_handshaking(), "the handshake did not finish");
            assert_eq!(c.negotiated_cipher_suite().unwrap().suite(), expected);
        }
    }
}
