//! Host identity: hostname, cluster, and the cloud instance the bill will name.
//!
//! The instance comes from config where given, else from the EC2 instance metadata service
//! (IMDSv2: a session token first, then the metadata) with a short timeout, so that a host off
//! the cloud simply has none.

use std::time::Duration;

use gpuledger_proto::HostInfo;

#[derive(Debug, Clone, Default)]
pub struct HostConfig {
    pub hostname: Option<String>,
    pub cluster: String,
    pub provider: Option<String>,
    pub instance_id: Option<String>,
    pub instance_type: Option<String>,
    pub region: Option<String>,
    /// `on_demand` or `spot`.
    pub lifecycle: Option<String>,
    /// Base URL of the metadata service, or `None` to skip it.
    pub imds_endpoint: Option<String>,
    pub imds_timeout: Duration,
}

pub fn system_hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into a buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        if let Ok(name) = std::str::from_utf8(&buf[..end]) {
            if !name.is_empty() {
                return name.to_owned();
            }
        }
    }
    "unknown-host".to_owned()
}

#[derive(Debug, Default, PartialEq)]
pub struct CloudInstance {
    pub instance_id: String,
    pub instance_type: Option<String>,
    pub region: Option<String>,
    pub lifecycle: Option<String>,
}

/// EC2 says `spot` or `on-demand` (or `scheduled`); the server's pricing categories are
/// `spot` and `on_demand`.
pub fn normalize_lifecycle(value: &str) -> Option<String> {
    match value.trim().to_ascii_lowercase().replace('-', "_").as_str() {
        "spot" => Some("spot".into()),
        "on_demand" | "ondemand" | "normal" | "scheduled" => Some("on_demand".into()),
        _ => None,
    }
}

/// Asks the EC2 metadata service (IMDSv2). `None` when it does not answer in time.
pub async fn query_imds(endpoint: &str, timeout: Duration) -> Option<CloudInstance> {
    let client = reqwest::Client::builder().timeout(timeout).build().ok()?;
    let base = endpoint.trim_end_matches('/');
    let token = client
        .put(format!("{base}/latest/api/token"))
        .header("X-aws-ec2-metadata-token-ttl-seconds", "60")
        .send()
        .await
        .ok()?
        .error_for_status()
        .ok()?
        .text()
        .await
        .ok()?;
    let get = |path: &'static str| {
        let client = client.clone();
        let token = token.clone();
        let url = format!("{base}/latest/meta-data/{path}");
        async move {
            let resp = client
                .get(url)
                .header("X-aws-ec2-metadata-token", token)
                .send()
                .await
                .ok()?
                .error_for_status()
                .ok()?;
            resp.text().await.ok().map(|t| t.trim().to_owned())
        }
    };
    let instance_id = get("instance-id").await?;
    Some(CloudInstance {
        instance_id,
        instance_type: get("instance-type").await,
        region: get("placement/region").await,
        lifecycle: get("instance-life-cycle")
            .await
            .as_deref()
            .and_then(normalize_lifecycle),
    })
}

/// Config first; the metadata service fills only what config left open.
pub async fn identify(config: &HostConfig) -> HostInfo {
    let mut info = HostInfo {
        hostname: config.hostname.clone().unwrap_or_else(system_hostname),
        cluster: config.cluster.clone(),
        provider: config.provider.clone(),
        instance_id: config.instance_id.clone(),
        instance_type: config.instance_type.clone(),
        region: config.region.clone(),
        lifecycle: config.lifecycle.as_deref().and_then(normalize_lifecycle),
    };
    if info.instance_id.is_none() {
        if let Some(endpoint) = &config.imds_endpoint {
            match query_imds(endpoint, config.imds_timeout).await {
                Some(found) => {
                    info.provider.get_or_insert_with(|| "aws".to_owned());
                    info.instance_id = Some(found.instance_id);
                    info.instance_type = info.instance_type.take().or(found.instance_type);
                    info.region = info.region.take().or(found.region);
                    info.lifecycle = info.lifecycle.take().or(found.lifecycle);
                }
                None => tracing::debug!("no instance metadata service answered; not on EC2"),
            }
        }
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::{get, put};
    use axum::Router;

    const TOKEN: &str = "imds-session-token";

    async fn meta(headers: HeaderMap, value: &'static str) -> Result<&'static str, StatusCode> {
        match headers.get("X-aws-ec2-metadata-token") {
            Some(t) if t == TOKEN => Ok(value),
            _ => Err(StatusCode::UNAUTHORIZED),
        }
    }

    async fn fake_imds() -> String {
        let app = Router::new()
            .route("/latest/api/token", put(|| async { TOKEN }))
            .route(
                "/latest/meta-data/instance-id",
                get(|h: HeaderMap| meta(h, "i-0abc123")),
            )
            .route(
                "/latest/meta-data/instance-type",
                get(|h: HeaderMap| meta(h, "p4d.24xlarge")),
            )
            .route(
                "/latest/meta-data/placement/region",
                get(|h: HeaderMap| meta(h, "us-east-1")),
            )
            .route(
                "/latest/meta-data/instance-life-cycle",
                get(|h: HeaderMap| meta(h, "spot")),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn imdsv2_fills_the_instance_and_config_wins() {
        let endpoint = fake_imds().await;
        let mut config = HostConfig {
            hostname: Some("gpu-node-1".into()),
            cluster: "train".into(),
            imds_endpoint: Some(endpoint),
            imds_timeout: Duration::from_secs(2),
            region: Some("eu-west-1".into()),
            ..Default::default()
        };
        let info = identify(&config).await;
        assert_eq!(info.provider.as_deref(), Some("aws"));
        assert_eq!(info.instance_id.as_deref(), Some("i-0abc123"));
        assert_eq!(info.instance_type.as_deref(), Some("p4d.24xlarge"));
        assert_eq!(info.lifecycle.as_deref(), Some("spot"));
        assert_eq!(
            info.region.as_deref(),
            Some("eu-west-1"),
            "config wins over metadata"
        );

        config.instance_id = Some("on-prem-7".into());
        config.region = None;
        let info = identify(&config).await;
        assert_eq!(info.instance_id.as_deref(), Some("on-prem-7"));
        assert_eq!(
            info.region, None,
            "metadata is not asked when config names the instance"
        );
    }

    #[test]
    fn lifecycles() {
        assert_eq!(
            normalize_lifecycle("on-demand").as_deref(),
            Some("on_demand")
        );
        assert_eq!(normalize_lifecycle("Spot").as_deref(), Some("spot"));
        assert_eq!(normalize_lifecycle("reserved?"), None);
    }

    #[tokio::test]
    async fn no_metadata_service_means_no_instance() {
        // A closed loopback port: connection refused at once.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let config = HostConfig {
            cluster: "c".into(),
            imds_endpoint: Some(endpoint),
            imds_timeout: Duration::from_millis(300),
            ..Default::default()
        };
        let info = identify(&config).await;
        assert_eq!(info.instance_id, None);
        assert_eq!(info.provider, None);
    }
}
