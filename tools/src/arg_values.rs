//! Parsers of flag values shared by subcommands, whose errors list what is accepted: `HOST:PORT`
//! (`--addr`, `--listen`; an IP address or a host name, resolved once when the argument is parsed,
//! never re-resolved: a client reconnects to the address it resolved) and booleans set from the
//! environment (`SHARDLINE_NO_PIN`).

use std::net::{SocketAddr, ToSocketAddrs as _};

/// Parses `text` as `IP:PORT` or `HOST:PORT` (e.g. `localhost:8090`, `[::1]:8090`). A host name
/// resolves (getaddrinfo) to its first IPv4 address, else its first IPv6 one: `localhost` then
/// means 127.0.0.1 for the client and the server alike, matching the default `--listen`.
///
/// # Errors
/// A text naming `text` and why: no `:PORT`, a name that does not resolve, or one that resolves
/// to no address. Used as a clap `value_parser`, which prefixes the flag's name.
pub fn parse_host_port(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!(
            "{text:?} is not HOST:PORT (e.g. 127.0.0.1:8090 or localhost:8090)"
        ));
    };
    if port.parse::<u16>().is_err() {
        return Err(format!(
            "{text:?}: port {port:?} is not a port number (0 to 65535)"
        ));
    }
    let addrs: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|error| format!("cannot resolve host name {host:?} of {text:?}: {error}"))?
        .collect();
    addrs
        .iter()
        .find(|addr| addr.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| format!("host name {host:?} of {text:?} resolves to no address"))
}

/// Values a boolean flag's environment variable accepts, as listed in errors.
pub const BOOLEAN_VALUES: &str = "1, 0, true, false, yes, no, on, off (any case)";

/// Parses a boolean flag value (from a `SHARDLINE_*` variable such as `SHARDLINE_NO_PIN`):
/// `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off`, any case, surrounding spaces ignored.
///
/// # Errors
/// A text naming `text` and listing the accepted values.
pub fn parse_boolean(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!(
            "{text:?} is not a boolean; accepted: {BOOLEAN_VALUES}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue7_6_a_bad_boolean_lists_the_accepted_values() {
        assert_eq!(
            parse_boolean("maybe"),
            Err("\"maybe\" is not a boolean; accepted: 1, 0, true, false, yes, no, on, off (any case)".into())
        );
        assert_eq!(parse_boolean(" YES "), Ok(true));
        assert_eq!(parse_boolean("off"), Ok(false));
    }

    #[test]
    fn issue7_6_localhost_resolves_to_ipv4_loopback() {
        assert_eq!(
            parse_host_port("localhost:8090"),
            Ok(SocketAddr::from(([127, 0, 0, 1], 8090)))
        );
    }

    #[test]
    fn ip_addresses_parse_without_resolving() {
        assert_eq!(
            parse_host_port("[::1]:9"),
            Ok("[::1]:9".parse::<SocketAddr>().unwrap())
        );
        assert_eq!(
            parse_host_port("10.1.2.3:0"),
            Ok(SocketAddr::from(([10, 1, 2, 3], 0)))
        );
    }

    #[test]
    fn issue7_6_bad_host_port_names_the_text() {
        assert_eq!(
            parse_host_port("localhost"),
            Err("\"localhost\" is not HOST:PORT (e.g. 127.0.0.1:8090 or localhost:8090)".into())
        );
        assert_eq!(
            parse_host_port("localhost:http"),
            Err("\"localhost:http\": port \"http\" is not a port number (0 to 65535)".into())
        );
        let error = parse_host_port("no-such-host.invalid:8090").unwrap_err();
        assert!(
            error.starts_with(
                "cannot resolve host name \"no-such-host.invalid\" of \"no-such-host.invalid:8090\": "
            ),
            "{error}"
        );
    }
}
