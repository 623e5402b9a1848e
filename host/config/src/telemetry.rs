//! `[telemetry]`: where this node sends its traces.
//!
//! Rule: off unless an endpoint is named. The node exports a span per
//! webhook, turn, model call and tool call over OTLP/HTTP (protobuf) to
//! `otlp_endpoint`'s `/v1/traces` — a collector or agent beside the node
//! (plain `http://`; TLS and fan-out are the collector's job, so the node
//! carries no TLS stack for it). A URL that is not `http://host[:port]`
//! (with an optional path prefix) is refused with the key.

use serde::Deserialize;

/// The `[telemetry]` section, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP base URL (`http://127.0.0.1:4318`); `None`: no export.
    pub otlp_endpoint: Option<String>,
}

pub(crate) mod raw {
    use super::*;

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Telemetry {
        pub otlp_endpoint: Option<String>,
    }
}

impl raw::Telemetry {
    /// `Err((key, message))` when the endpoint is not a plain HTTP URL.
    pub(crate) fn validate(self) -> Result<TelemetryConfig, (&'static str, String)> {
        const KEY: &str = "telemetry.otlp_endpoint";
        let Some(url) = self.otlp_endpoint else {
            return Ok(TelemetryConfig::default());
        };
        let refuse = |why: &str| {
            Err((
                KEY,
                format!(
                    "expected an OTLP/HTTP base URL like http://127.0.0.1:4318, found {url:?}: {why}"
                ),
            ))
        };
        let Some(rest) = url.strip_prefix("http://") else {
            return refuse(
                "only plain http:// is spoken; run an OpenTelemetry Collector beside the node for TLS",
            );
        };
        let authority = rest.split('/').next().unwrap_or("");
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (h, Some(p)),
            _ => (authority, None),
        };
        if host.is_empty() || host.contains(['@', '?', '#', ' ']) {
            return refuse("it names no host");
        }
        if let Some(p) = port
            && p.parse::<u16>().map_or(true, |p| p == 0)
        {
            return refuse("its port is not 1 to 65535");
        }
        if rest.contains(['?', '#']) {
            return refuse("a query or fragment has no place in it");
        }
        Ok(TelemetryConfig {
            otlp_endpoint: Some(url.trim_end_matches('/').to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(url: &str) -> Result<TelemetryConfig, (&'static str, String)> {
        raw::Telemetry {
            otlp_endpoint: Some(url.to_string()),
        }
        .validate()
    }

    #[test]
    fn plain_http_endpoints_pass_and_others_are_refused_at_the_key() {
        assert_eq!(
            check("http://127.0.0.1:4318/")
                .unwrap()
                .otlp_endpoint
                .as_deref(),
            Some("http://127.0.0.1:4318")
        );
        assert!(check("http://collector/otlp").is_ok());
        assert!(check("http://[::1]:4318").is_ok());
        for bad in [
            "https://collector:4318",
            "collector:4318",
            "http://:4318",
            "http://c:99999",
            "http://c:0",
            "http://c:4318/?a=b",
            "http://user@c:4318",
        ] {
            let (key, why) = check(bad).unwrap_err();
            assert_eq!(key, "telemetry.otlp_endpoint", "{bad}");
            assert!(why.contains(bad), "{why}");
        }
        assert_eq!(
            raw::Telemetry::default().validate().unwrap(),
            TelemetryConfig::default()
        );
    }
}
