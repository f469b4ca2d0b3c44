//! Redirect URIs of OAuth clients: which may be registered, and which presented one matches a
//! registered one (RFC 8252 for native apps). Shared by client registration (the services) and
//! the authorization endpoint.

fn is_loopback_host(host: Option<url::Host<&str>>) -> bool {
    match host {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// Whether `uri` may be registered as a redirect URI: an absolute URL without a fragment;
/// https, http only to a loopback address (RFC 8252 §7.3), or a private-use scheme of
/// reverse-domain form (RFC 8252 §7.1).
pub fn check_registered_redirect(uri: &str) -> Result<(), String> {
    if uri.len() > 2048 {
        return Err("a redirect URI is longer than 2048 bytes".into());
    }
    let u = url::Url::parse(uri).map_err(|_| format!("redirect URI `{uri}` is not a URL"))?;
    if u.fragment().is_some() {
        return Err(format!("redirect URI `{uri}` has a fragment"));
    }
    match u.scheme() {
        "https" => Ok(()),
        "http" if is_loopback_host(u.host()) => Ok(()),
        "http" => Err(format!(
            "redirect URI `{uri}` uses http to a host that is not loopback"
        )),
        s if s.contains('.') => Ok(()),
        _ => Err(format!("redirect URI `{uri}` has an unsupported scheme")),
    }
}

/// Whether a presented redirect URI matches a registered one: exactly, except that a loopback
/// http URI may use any port (RFC 8252 §7.3: the host picks one when it starts).
pub fn redirect_matches(registered: &str, presented: &str) -> bool {
    if registered == presented {
        return true;
    }
    let (Ok(r), Ok(p)) = (url::Url::parse(registered), url::Url::parse(presented)) else {
        return false;
    };
    r.scheme() == "http"
        && p.scheme() == "http"
        && is_loopback_host(r.host())
        && r.host() == p.host()
        && r.path() == p.path()
        && r.query() == p.query()
        && p.username().is_empty()
        && p.password().is_none()
        && p.fragment().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_may_vary_the_port_and_nothing_else() {
        let reg = "http://127.0.0.1/callback";
        assert!(redirect_matches(reg, "http://127.0.0.1:53111/callback"));
        assert!(!redirect_matches(reg, "http://127.0.0.1:53111/callback/x"));
        assert!(!redirect_matches(reg, "http://127.0.0.2:53111/callback"));
        assert!(!redirect_matches(reg, "https://127.0.0.1:53111/callback"));
        assert!(redirect_matches(
            "http://[::1]:1/cb",
            "http://[::1]:8080/cb"
        ));
        assert!(redirect_matches(
            "http://localhost:3000/cb",
            "http://localhost:4000/cb"
        ));
        // Anything else matches exactly or not at all.
        assert!(!redirect_matches(
            "https://app.example/cb",
            "https://app.example:444/cb"
        ));
        assert!(!redirect_matches(
            "https://app.example/cb",
            "https://app.example/cb?x=1"
        ));
    }

    #[test]
    fn only_safe_redirect_uris_can_be_registered() {
        assert!(check_registered_redirect("https://app.example/cb").is_ok());
        assert!(check_registered_redirect("http://127.0.0.1/cb").is_ok());
        assert!(check_registered_redirect("http://localhost:8080/cb").is_ok());
        assert!(check_registered_redirect("com.example.app:/cb").is_ok());
        assert!(check_registered_redirect("http://app.example/cb").is_err());
        assert!(check_registered_redirect("https://app.example/cb#x").is_err());
        assert!(check_registered_redirect("javascript:alert(1)").is_err());
    }
}
