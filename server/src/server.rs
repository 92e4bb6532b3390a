//! Wiring: store, hub and service into a tonic server with health checking,
//! reflection, admission (authentication, rate), metrics and TLS, and an
//! orderly shutdown.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use futures_util::StreamExt as _;
use tokio::net::TcpListener;
use tonic::transport::ServerTlsConfig;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;

use crate::admission::{Admission, RateLimiter, WatchPermits};
use crate::auth::Authenticator;
use crate::config::ServeConfig;
use crate::connection::Coalesced;
use crate::grpc::{EncodedStreams, Limits, ServiceOptions, SessionStoreService};
use crate::health::{self, ProbeOptions};
use crate::inflight::{self, InFlight, InFlightLayer};
use crate::metrics::{self, Metrics, MetricsLayer};
use crate::store::{self, Store, StoreOptions};
use crate::sweep::{self, SweepOptions};
use crate::tls;
use crate::watch::{Hub, RunLimits, WatchOptions};

/// Streams of one connection the server may reset for a client's errors
/// before it ends the connection (hyper's default).
const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;
/// Streams of one connection a client may reset before the server has
/// accepted them, before the connection is ended (h2's default).
const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;
/// Largest header list (the call's metadata) a request may carry.
const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;

/// Creates the directory a `sqlite://PATH` URL's file lives in.
pub fn prepare_sqlite_path(url: &str) -> anyhow::Result<()> {
    let Some(rest) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    else {
        return Ok(());
    };
    let path = rest.split('?').next().unwrap_or_default();
    if path.is_empty() || path.contains(":memory:") {
        return Ok(());
    }
    if let Some(dir) = Path::new(path)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the database directory {}", dir.display()))?;
        tracing::info!(directory = %dir.display(), "created the database's directory");
    }
    Ok(())
}

/// Applies migrations for `database_url` (the `migrate` command): the
/// pending expand ones, or with `MigrateMode::Finalize` all of them. Each
/// one applied is logged as it is.
pub async fn migrate(database_url: &str, mode: store::MigrateMode) -> anyhow::Result<()> {
    prepare_sqlite_path(database_url)?;
    let migrated = store::migrate(database_url, mode).await?;
    let database = redact_url(database_url);
    if migrated.applied.is_empty() {
        tracing::info!(%database, schema = migrated.schema, ?mode, "the schema is current");
    } else {
        tracing::info!(
            %database,
            schema = migrated.schema,
            applied = migrated.applied.len(),
            ?mode,
            "the schema is up to date"
        );
    }
    Ok(())
}

/// Serves on `listener` until `shutdown` resolves, then ends watch streams,
/// lets in-flight calls finish and closes the store. Metrics are served on
/// `--metrics-listen` when it is set.
pub async fn serve(
    config: ServeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let metrics_listener = match &config.telemetry.metrics_listen {
        Some(address) => Some(
            TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen on --metrics-listen {address}"))?,
        ),
        None => None,
    };
    serve_with_metrics(config, listener, metrics_listener, shutdown).await
}

/// [`serve`], with the metrics listener already bound (tests bind port 0).
pub async fn serve_with_metrics(
    config: ServeConfig,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let url = config.database.database_url.clone();
    check_exposure(&config, &listener)?;
    let tls = tls::server_config(&config.tls)?;
    let cors = crate::web::cors(&config)?;
    let hub = Arc::new(Hub::new(run_limits(&config)?));
    prepare_sqlite_path(&url)?;
    let options = StoreOptions {
        max_connections: config.database.max_connections,
        append_writers: config.append_writers,
        append_one_trip: config.append_one_trip == crate::config::Switch::On,
        recheck_interval: config.recheck_interval(),
        search: config.search == crate::config::SearchMode::On,
        wal_writes: match config.sqlite_wal_writes {
            crate::config::WalWritesMode::Gathered => store::WalWrites::Gathered,
            crate::config::WalWritesMode::Direct => store::WalWrites::Direct,
        },
        // The bound address, its port resolved: the replica registry's.
        advertised_address: listener.local_addr().ok().map(|a| a.to_string()),
    };
    let store = store::open(&url, hub.clone(), &options).await?;
    let listeners = Listeners {
        grpc: listener,
        metrics: metrics_listener,
        tls,
        cors,
    };
    serve_store(config, store, hub, listeners, shutdown).await
}

struct Listeners {
    grpc: TcpListener,
    metrics: Option<TcpListener>,
    tls: Option<ServerTlsConfig>,
    /// CORS for browsers' gRPC-Web calls (see web.rs).
    cors: tower_http::cors::CorsLayer,
}

async fn serve_store<S: Store>(
    config: ServeConfig,
    store: S,
    hub: Arc<Hub>,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new(&[
        sessionstore_client::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
    ]));
    let pool_store = store.clone();
    metrics.set_pool_probe(move || pool_store.pool_status());
    let run_hub = Arc::clone(&hub);
    metrics.set_active_run_probe(move || run_hub.active_run_bytes());
    let in_flight = InFlight::new(
        config.limits.max_request_bytes_in_flight,
        config.max_request_bytes,
    );
    let in_flight_gauge = Arc::clone(&in_flight);
    metrics.set_request_bytes_probe(move || in_flight_gauge.bytes());
    let in_flight = InFlightLayer::new(
        in_flight,
        inflight::single_message_methods(&[
            sessionstore_client::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
        ]),
    );
    let service = SessionStoreService::new(
        store.clone(),
        Arc::clone(&hub),
        ServiceOptions {
            watch: WatchOptions {
                progress_interval: config.progress_interval(),
            },
            limits: Limits {
                max_messages_per_exchange: config.limits.max_messages_per_exchange,
                max_message_bytes: config.limits.max_message_bytes,
                max_metadata_entries: config.limits.max_metadata_entries,
                max_page_size: config.limits.max_page_size,
                max_stream_buffer_bytes: config.limits.max_stream_buffer_bytes,
            },
            watch_permits: WatchPermits::new(config.limits.max_watch_streams_per_tenant),
            metrics: Arc::clone(&metrics),
        },
    );
    let (authenticator, reloader) = match &config.auth_tokens {
        Some(path) => {
            let (authenticator, reloader) = Authenticator::from_file(path.clone())?;
            (authenticator, Some(reloader))
        }
        None => (Authenticator::open(), None),
    };
    let admission = Admission::new(
        authenticator,
        RateLimiter::new(config.limits.max_requests_per_second),
    );
    let (health, health_service) = tonic_health::server::health_reporter();
    health::set_all(&health, ServingStatus::Serving).await;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(sessionstore_client::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            // google.rpc.Status, ErrorInfo, BadRequest, RetryInfo…: so that
            // reflection clients (grpcurl) can decode error details.
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    let mut builder = tonic::transport::Server::builder()
        // gRPC-Web from browsers comes over HTTP/1.1 too (see web.rs).
        .accept_http1(true)
        .max_concurrent_streams(config.limits.max_concurrent_streams_per_connection)
        // tonic turns hyper's default (1,024) off unless given one; a client
        // that makes the server reset streams (RUSTSEC-2024-0003) is sent
        // GOAWAY past it.
        .http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESET_STREAMS))
        // Streams a client resets before the server accepts them (rapid
        // reset, CVE-2023-44487), as h2's default, but stated.
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
        // Header lists (metadata) up to 16 KiB, as hyper's default, but stated.
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES);
    let tls_enabled = listeners.tls.is_some();
    if let Some(tls) = listeners.tls {
        builder = builder
            .tls_config(tls)
            .context("the TLS certificate, key or client CA is not usable")?;
    }
    let metrics_server = match listeners.metrics {
        Some(listener) => {
            let address = listener
                .local_addr()
                .map_or_else(|_| "unknown".to_owned(), |address| address.to_string());
            tracing::info!(%address, "metrics serving at /metrics");
            Some(tokio::spawn(metrics::serve_http(
                listener,
                Arc::clone(&metrics),
            )))
        }
        None => None,
    };

    warn_exposure(&config, &listeners.grpc);
    let local = listeners
        .grpc
        .local_addr()
        .map_or_else(|_| config.listen.clone(), |address| address.to_string());
    tracing::info!(
        address = %local,
        tls = tls_enabled,
        client_certificates = config.tls.tls_client_ca.is_some(),
        database = %redact_url(&config.database.database_url),
        "sessionstore serving"
    );

    // Turns true when shutdown begins: the sweeper and the health probe stop.
    let (stopping, _) = tokio::sync::watch::channel(false);
    let sweeper = tokio::spawn(sweep::run(
        store.clone(),
        Arc::clone(&hub),
        SweepOptions {
            interval: config.sweep_interval(),
            max_idle_age: config.max_idle_age,
        },
        stopping.subscribe(),
    ));
    let prober = tokio::spawn(health::follow_database(
        store.clone(),
        health.clone(),
        ProbeOptions::default(),
        stopping.subscribe(),
    ));

    // Reads a session's missed events once for all its watchers; stops with the hub.
    let fetcher = hub.start_fetcher(store.clone());

    let stopping_hub = Arc::clone(&hub);
    let grace = config.shutdown_grace;
    // When shutdown began: the grace period counts from then.
    let (began, shutdown_began) = tokio::sync::watch::channel(None);
    let signal = async move {
        shutdown.await;
        began.send_replace(Some(tokio::time::Instant::now()));
        let _ = stopping.send(true);
        tracing::info!(
            ?grace,
            "shutting down: ending watch streams, finishing in-flight calls"
        );
        health::set_all(&health, ServingStatus::NotServing).await;
        stopping_hub.close();
    };
    // Connections get three quarters of the grace period to finish their
    // calls; then the server stops waiting for them (a peer that never
    // reads again cannot take its stream's last frames), and the rest of
    // the period is the store's to finish its writes.
    let mut began_at = shutdown_began.clone();
    let deadline = async move {
        match began_at.wait_for(Option::is_some).await.map(|began| *began) {
            Ok(Some(began)) => tokio::time::sleep_until(began + grace.mul_f64(0.75)).await,
            _ => std::future::pending().await,
        }
    };
    let serving = builder
        .layer(listeners.cors)
        .layer(tonic_web::GrpcWebLayer::new())
        .layer(MetricsLayer(Arc::clone(&metrics)))
        .layer(in_flight)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(tonic::service::interceptor::InterceptedService::new(
            EncodedStreams::new(service, config.max_request_bytes),
            admission,
        ))
        .serve_with_incoming_shutdown(
            // Replies are small and latency-bound: without TCP_NODELAY,
            // Nagle's algorithm holds many for a delayed ACK (~40 ms).
            // Each connection's frames leave in bursts (connection.rs).
            TcpIncoming::from(listeners.grpc)
                .with_nodelay(Some(true))
                .map(|accepted| accepted.map(Coalesced::new)),
            signal,
        );
    let result = tokio::select! {
        result = serving => result,
        () = deadline => {
            tracing::warn!(
                ?grace,
                "connections still open late in the shutdown grace period: closing them"
            );
            Ok(())
        }
    };
    // Usually stopped by the signal already; this covers a failed server.
    sweeper.abort();
    let _ = sweeper.await;
    prober.abort();
    fetcher.abort();
    if let Some(reloader) = reloader {
        reloader.abort();
    }
    if let Some(metrics_server) = metrics_server {
        metrics_server.abort();
    }
    // Every acknowledged write is already on disk; closing finishes the
    // writes still queued. Past the grace period the process exits anyway,
    // as after a kill, which loses nothing acknowledged.
    let close_by = shutdown_began
        .borrow()
        .unwrap_or_else(tokio::time::Instant::now)
        + grace;
    if tokio::time::timeout_at(close_by, store.close())
        .await
        .is_err()
    {
        tracing::warn!(
            ?grace,
            "the store did not close within the shutdown grace period"
        );
    }
    tracing::info!("sessionstore stopped");
    result.context("the gRPC server failed")
}

/// The smallest hard limit on one run's partial output.
const MIN_RUN_OUTPUT_BYTES: usize = 16 * 1024 * 1024;

/// How much partial output of active runs the hub keeps.
fn run_limits(config: &ServeConfig) -> anyhow::Result<RunLimits> {
    let limits = &config.limits;
    anyhow::ensure!(
        limits.max_run_output_bytes >= MIN_RUN_OUTPUT_BYTES,
        "--max-run-output-bytes must be at least {MIN_RUN_OUTPUT_BYTES} (16 MiB)"
    );
    anyhow::ensure!(
        limits.max_run_deltas >= 2,
        "--max-run-deltas must be at least 2"
    );
    Ok(RunLimits {
        merge_after: limits.max_run_deltas,
        max_run_bytes: limits.max_run_output_bytes,
        max_total_bytes: limits.max_active_run_bytes,
    })
}

/// Without a token file, refuses to serve anything but loopback unless
/// told `--insecure-no-auth`: a careless deployment fails closed.
fn check_exposure(config: &ServeConfig, listener: &TcpListener) -> anyhow::Result<()> {
    if config.auth_tokens.is_some() {
        return Ok(());
    }
    let loopback = listener
        .local_addr()
        .map(|a| a.ip().is_loopback())
        .unwrap_or(false);
    if loopback || config.insecure_no_auth {
        // Said once everything else is known to work (warn_exposure):
        // a warning must not come before a fatal error.
        Ok(())
    } else {
        anyhow::bail!(
            "refusing to serve unauthenticated on non-loopback address {}: give --auth-tokens PATH, or --insecure-no-auth",
            config.listen
        )
    }
}

/// Warns that the server serves without authentication, when it does.
fn warn_exposure(config: &ServeConfig, listener: &TcpListener) {
    if config.auth_tokens.is_some() {
        return;
    }
    let loopback = listener
        .local_addr()
        .map(|a| a.ip().is_loopback())
        .unwrap_or(false);
    if loopback {
        tracing::warn!(
            "no --auth-tokens: serving unauthenticated (tenant \"default\") on loopback only"
        );
    } else {
        tracing::warn!("--insecure-no-auth: serving unauthenticated on a non-loopback address");
    }
}

/// A database URL without its password, for logs.
fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}://{user}:***{}", &url[..scheme_end], &url[at..])
        }
        _ => url.to_owned(),
    }
}
