//! Who may use `--serve`'s door and its metrics port: the networks admitted (`--allow
//! CIDR`, checked on the peer's address right after accept, before a byte is read), and
//! the shared secret a collector proves (`--secret-file`).
//!
//! The proof is a challenge over the hello. A server with a secret writes one line as it
//! accepts a connection, `rdma-doctor-auth 1 NONCE` (32 random bytes in hex); the client
//! answers with its hello (or fleet request) prefixed by its proof, `AUTH MAC HELLO`, where
//! MAC is the HMAC-SHA256 under the secret of the line `rdma-doctor-auth 1 NONCE`, a newline
//! and HELLO. A fresh nonce per connection makes a recorded proof worthless, and the MAC
//! covers the request, so a proof cannot be moved onto another request. The secret never
//! crosses the wire; nothing is encrypted (the reports are not secret, the door is).
//!
//! The metrics port takes no secret (a Prometheus scraper cannot answer a challenge):
//! limit it with `--allow` and `--listen`.

use std::fmt;
use std::io::Read;
use std::net::IpAddr;
use std::path::Path;

use hmac::{Hmac, Mac};
use ipnet::IpNet;
use sha2::Sha256;

/// What a server with a secret sends first, before the nonce.
pub const CHALLENGE: &str = "rdma-doctor-auth 1 ";
/// What a client's proof line starts with.
pub const PROOF: &str = "AUTH ";
/// Bytes of a nonce.
const NONCE_BYTES: usize = 32;
/// The shortest secret taken, bytes.
pub const MIN_SECRET_BYTES: usize = 16;
/// The longest secret file read.
const MAX_SECRET_BYTES: u64 = 4096;

/// The networks admitted; empty admits every address (no `--allow`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(Vec<IpNet>);

impl AllowList {
    /// The list of `--allow` values: each `ADDRESS/PREFIX` or one address.
    pub fn parse(cidrs: &[String]) -> Result<AllowList, String> {
        cidrs.iter().map(|c| parse_cidr(c)).collect::<Result<_, _>>().map(AllowList)
    }

    /// Whether `ip` may come in (an IPv4-mapped IPv6 address is judged as IPv4).
    pub fn admits(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.is_empty() || self.0.iter().any(|n| n.contains(&ip))
    }

    /// Whether the list admits every address (none was given).
    pub fn is_open(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("every address");
        }
        let nets: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&nets.join(", "))
    }
}

/// `10.0.0.0/8`, `fd00::/8`, or one address (`/32`, `/128`). Host bits set under the
/// prefix are refused: `10.0.0.1/8` is more likely a typo than a network.
pub fn parse_cidr(s: &str) -> Result<IpNet, String> {
    if !s.contains('/') {
        let ip: IpAddr = s.parse().map_err(|_| format!("--allow {s:?}: give ADDRESS/PREFIX or an address"))?;
        return Ok(IpNet::from(ip));
    }
    let net: IpNet = s.parse().map_err(|_| format!("--allow {s:?}: give ADDRESS/PREFIX (10.0.0.0/8, fd00::/8)"))?;
    if net.trunc() != net {
        return Err(format!(
            "--allow {s}: host bits are set under /{}; did you mean {}?",
            net.prefix_len(),
            net.trunc()
        ));
    }
    Ok(net)
}

/// The shared secret of `--secret-file`. Its `Debug` does not show it.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// The secret in `path`: its bytes without the trailing newline, at least
    /// [`MIN_SECRET_BYTES`], from a file only its owner can read.
    pub fn load(path: &Path) -> Result<Secret, String> {
        use std::os::unix::fs::PermissionsExt;
        let name = path.display();
        let file = std::fs::File::open(path).map_err(|e| format!("--secret-file {name}: {e}"))?;
        let meta = file.metadata().map_err(|e| format!("--secret-file {name}: {e}"))?;
        if !meta.is_file() {
            return Err(format!("--secret-file {name}: not a regular file"));
        }
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(format!(
                "--secret-file {name}: others can read it (mode {:o}): chmod 600 {name}",
                meta.permissions().mode() & 0o777
            ));
        }
        let mut bytes = Vec::new();
        file.take(MAX_SECRET_BYTES + 1).read_to_end(&mut bytes).map_err(|e| format!("--secret-file {name}: {e}"))?;
        if bytes.len() as u64 > MAX_SECRET_BYTES {
            return Err(format!("--secret-file {name}: over {MAX_SECRET_BYTES} bytes"));
        }
        Secret::new(bytes).map_err(|e| format!("--secret-file {name}: {e}"))
    }

    /// A secret of `bytes` (one trailing newline dropped).
    pub fn new(mut bytes: Vec<u8>) -> Result<Secret, String> {
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(format!("a secret of {} bytes: give at least {MIN_SECRET_BYTES}", bytes.len()));
        }
        Ok(Secret(bytes))
    }

    fn mac(&self, challenge: &str, hello: &str) -> Hmac<Sha256> {
        // Any key length is valid for HMAC: new_from_slice cannot fail.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(challenge.as_bytes());
        mac.update(b"\n");
        mac.update(hello.as_bytes());
        mac
    }

    /// The line a client sends in place of `hello` after the server's `challenge` line
    /// (without its newline); an error when `challenge` is not one.
    pub fn prove(&self, challenge: &str, hello: &str) -> Result<String, String> {
        match challenge.strip_prefix(CHALLENGE) {
            Some(nonce) if nonce.len() == 2 * NONCE_BYTES && nonce.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Ok(format!("{PROOF}{} {hello}", hex(&self.mac(challenge, hello).finalize().into_bytes())))
            }
            _ => {
                let start: String = challenge.chars().take(40).collect();
                Err(format!(
                    "expected the server's challenge ({CHALLENGE}...), got {start:?}: does it run with --secret-file?"
                ))
            }
        }
    }

    /// The hello within `line` when it carries a valid proof for `challenge`, compared in
    /// constant time; `None` otherwise.
    pub fn verify(&self, challenge: &str, line: &str) -> Option<String> {
        let (mac, hello) = line.strip_prefix(PROOF)?.split_once(' ')?;
        let mac = unhex(mac)?;
        self.mac(challenge, hello).verify_slice(&mac).ok()?;
        Some(hello.to_owned())
    }
}

/// A fresh challenge line (without its newline), from the kernel's random numbers.
pub fn challenge() -> std::io::Result<String> {
    let mut nonce = [0u8; NONCE_BYTES];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut nonce)?;
    Ok(format!("{CHALLENGE}{}", hex(&nonce)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || !s.is_ascii() {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_and_single_addresses_parse_and_typos_are_refused_with_the_reason() {
        let list = AllowList::parse(&["10.0.0.0/8".into(), "192.168.1.7".into(), "fd00::/8".into()]).unwrap();
        assert!(list.admits("10.255.3.4".parse().unwrap()));
        assert!(list.admits("192.168.1.7".parse().unwrap()));
        assert!(!list.admits("192.168.1.8".parse().unwrap()));
        assert!(list.admits("fd12::1".parse().unwrap()));
        assert!(!list.admits("127.0.0.1".parse().unwrap()));
        assert!(!list.admits("::1".parse().unwrap()));
        // A listener on [::] sees IPv4 clients as ::ffff:a.b.c.d.
        assert!(list.admits("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!list.admits("::ffff:11.1.2.3".parse().unwrap()));
        assert_eq!(list.to_string(), "10.0.0.0/8, 192.168.1.7/32, fd00::/8");
        assert!(AllowList::default().admits("203.0.113.9".parse().unwrap()), "no --allow admits all");
        assert!(AllowList::parse(&["0.0.0.0/0".into()]).unwrap().admits("203.0.113.9".parse().unwrap()));
        for (bad, why) in [
            ("10.0.0.1/8", "did you mean 10.0.0.0/8"),
            ("10.0.0.0/33", "ADDRESS/PREFIX"),
            ("node-1", "ADDRESS/PREFIX or an address"),
            ("10.0.0.0/", "ADDRESS/PREFIX"),
            ("", "an address"),
        ] {
            let e = parse_cidr(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_proof_verifies_only_with_the_same_secret_challenge_and_hello() {
        let secret = Secret::new(b"0123456789abcdef\n".to_vec()).unwrap();
        let ch = challenge().unwrap();
        assert_ne!(ch, challenge().unwrap(), "a fresh nonce each time");
        let line = secret.prove(&ch, "{\"hello\":1}").unwrap();
        assert_eq!(secret.verify(&ch, &line).as_deref(), Some("{\"hello\":1}"));
        let other = Secret::new(b"0123456789abcdeX".to_vec()).unwrap();
        assert_eq!(other.verify(&ch, &line), None, "another secret");
        assert_eq!(secret.verify(&challenge().unwrap(), &line), None, "a replay on another challenge");
        assert_eq!(secret.verify(&ch, &line.replace("\"hello\":1", "\"hello\":2")), None, "another hello");
        assert_eq!(secret.verify(&ch, "{\"hello\":1}"), None, "no proof at all");
        assert_eq!(secret.verify(&ch, "AUTH zz {}"), None);
        assert!(secret.prove("{\"magic\":\"rdma-doctor-peer\"}", "x").unwrap_err().contains("--secret-file"));
        assert!(Secret::new(b"short\n".to_vec()).unwrap_err().contains("at least 16"));
        assert_eq!(format!("{secret:?}"), "Secret(..)");
    }

    #[test]
    fn a_secret_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("rdma-doctor-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Secret::load(&path).unwrap_err().contains("chmod 600"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Secret::load(&path).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
