use http::header::HOST;
use http::uri::Authority;

use super::{Key, KeyExtractor};

/// Keys requests by the host they are sent to, for a client that calls
/// several upstream APIs through one layer: `host:api.example.com`, with
/// `:port` when the request names one.
///
/// Reads the request URI's authority (a client's requests carry absolute
/// URIs), else the `Host` header. User information in the authority
/// (`user:password@`) is never part of the key. The host is lowercased. A
/// request with neither yields no key.
///
/// ```
/// use fleetgate::key::{HostKey, KeyExtractor};
///
/// let req = http::Request::get("https://API.example.com/v1/items").body(()).unwrap();
/// assert_eq!(HostKey.extract(&req).unwrap().text(), "host:api.example.com");
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct HostKey;

impl<B> KeyExtractor<http::Request<B>> for HostKey {
    fn extract(&self, req: &http::Request<B>) -> Option<Key> {
        let from_header;
        let authority = match req.uri().authority() {
            Some(authority) => authority,
            None => {
                let value = req.headers().get(HOST)?.to_str().ok()?;
                from_header = value.parse::<Authority>().ok()?;
                &from_header
            }
        };
        let host = authority.host();
        if host.is_empty() {
            return None;
        }
        let host = host.to_ascii_lowercase();
        Some(Key::new(match authority.port_u16() {
            Some(port) => format!("host:{host}:{port}"),
            None => format!("host:{host}"),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(req: http::Request<()>) -> Option<String> {
        HostKey.extract(&req).map(|k| k.text().to_string())
    }

    #[test]
    fn uri_authority_then_host_header() {
        let req = http::Request::get("http://user:secret@Example.com:8080/x")
            .body(())
            .unwrap();
        assert_eq!(key(req).as_deref(), Some("host:example.com:8080"));
        let req = http::Request::get("/x")
            .header("host", "api.example.com")
            .body(())
            .unwrap();
        assert_eq!(key(req).as_deref(), Some("host:api.example.com"));
        let req = http::Request::get("/x").body(()).unwrap();
        assert_eq!(key(req), None);
        let req = http::Request::get("/x")
            .header("host", "not a host")
            .body(())
            .unwrap();
        assert_eq!(key(req), None);
        let req = http::Request::get("/x")
            .header("host", &b"caf\xc3\xa9"[..])
            .body(())
            .unwrap();
        assert_eq!(key(req), None);
    }
}
