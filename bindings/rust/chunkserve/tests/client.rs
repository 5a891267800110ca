//! The remote client against a real chunkserve-worker process (CHUNKSERVE_WORKER_BIN, set by
//! ctest) on 127.0.0.1 with an ephemeral port: streaming equals the in-process engine,
//! cancellation, TLS. The tests are `#[ignore]`d because they need CHUNKSERVE_WORKER_BIN; ctest
//! runs them with `-- --include-ignored`, and without the variable they fail saying so.
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use chunkserve::{Client, ClientOptions, Code, Event, FinishReason, Request};

/// A worker process, killed on drop.
struct Worker {
    child: Child,
    port: u16,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_worker() -> Worker {
    start_worker_with(&[])
}

/// The test certificates of tests/testing/tls.
fn tls_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../tests/testing/tls")
        .join(name)
}

fn start_worker_with(extra: &[&std::ffi::OsStr]) -> Worker {
    let bin = common::required_env("CHUNKSERVE_WORKER_BIN", "<build>/bin/chunkserve-worker");
    let mut child = Command::new(&bin)
        // 16-token chunks as common::options(), so in-process references compute the same way.
        .args([
            "--tiny-model",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--kv-cache-mb",
            "32",
        ])
        .args(["--chunk-size", "16"])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting CHUNKSERVE_WORKER_BIN={bin:?}: {e}"));
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if let Some(addr) = line.strip_prefix("listening on ") {
                let port = addr
                    .trim()
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse::<u16>().ok());
                let _ = tx.send(port);
            }
        }
    });
    let mut worker = Worker { child, port: 0 };
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Some(port)) => worker.port = port,
        other => panic!("the worker did not print its port: {other:?}"),
    }
    worker
}

#[test]
#[ignore = "needs CHUNKSERVE_WORKER_BIN (ctest sets it)"]
fn remote_stream_equals_the_in_process_engine() {
    let worker = start_worker();
    let client = Client::connect("127.0.0.1", worker.port, &ClientOptions::default())
        .expect("Client::connect");
    let prompt = common::prompt(60, 3);
    let request = Request::new(&prompt).max_new_tokens(12);
    let mut stream = client.submit(&request).expect("submit");
    assert_eq!(stream.id(), 1);
    let remote: Vec<i32> = stream.by_ref().collect::<Result<_, _>>().expect("tokens");
    let finish = stream.finish().expect("finish").clone();
    assert_eq!(finish.reason, FinishReason::Length);
    assert_eq!(finish.generated_tokens, 12);
    assert_eq!(finish.prompt_tokens, 60);

    let engine = common::engine();
    let local: Vec<i32> = engine
        .submit(&request)
        .expect("in-process submit")
        .collect::<Result<_, _>>()
        .expect("in-process tokens");
    assert_eq!(remote, local);

    // Rejected by the worker (token id >= vocab): the error comes through the stream.
    let bad = [1, 5000];
    let mut rejected = client.submit(&Request::new(&bad)).expect("submit");
    let err = rejected.find_map(|t| t.err()).expect("an error");
    assert_eq!(err.code, Code::InvalidArgument, "{err}");
}

#[test]
#[ignore = "needs CHUNKSERVE_WORKER_BIN (ctest sets it)"]
fn cancelling_a_remote_stream() {
    let worker = start_worker();
    let client = Client::connect("127.0.0.1", worker.port, &ClientOptions::default())
        .expect("Client::connect");
    let prompt = common::prompt(20, 4);
    let mut stream = client
        .submit(&Request::new(&prompt).max_new_tokens(4000))
        .expect("submit");
    match stream.next_event(Some(Duration::from_secs(60))) {
        Ok(Some(Event::Token { index: 0, .. })) => {}
        other => panic!("first event: {other:?}"),
    }
    stream.cancel().expect("cancel");
    let finish = stream.wait().expect("wait");
    assert_eq!(finish.reason, FinishReason::Cancelled);
    assert!(finish.generated_tokens < 3999, "{finish:?}");
    // By id, after the end: NotFound. A closed port: Unavailable.
    assert_eq!(client.cancel(stream.id()).unwrap_err().code, Code::NotFound);
    drop(client);
    drop(worker);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let err = Client::connect("127.0.0.1", port, &ClientOptions::default())
        .err()
        .expect("connecting to a closed port fails");
    assert_eq!(err.code, Code::Unavailable);
    assert!(err.message.contains(&port.to_string()), "{err}");
}

#[test]
#[ignore = "needs CHUNKSERVE_WORKER_BIN (ctest sets it)"]
fn speaks_tls_with_the_cluster_ca() {
    let (ca, cert, key) = (
        tls_fixture("ca.pem"),
        tls_fixture("node.pem"),
        tls_fixture("node.key"),
    );
    let worker = start_worker_with(&[
        "--tls-ca".as_ref(),
        ca.as_os_str(),
        "--tls-cert".as_ref(),
        cert.as_os_str(),
        "--tls-key".as_ref(),
        key.as_os_str(),
    ]);
    let options = ClientOptions::new().tls_ca_file(ca.clone());
    let client = Client::connect("127.0.0.1", worker.port, &options).expect("connect over TLS");
    let prompt = common::prompt(30, 2);
    let request = Request::new(&prompt).max_new_tokens(4);
    let mut stream = client.submit(&request).expect("submit");
    let tokens: Vec<i32> = stream.by_ref().collect::<Result<_, _>>().expect("tokens");
    assert_eq!(tokens.len(), 4);
    assert_eq!(
        stream.finish().expect("finish").reason,
        FinishReason::Length
    );
    // A server certificate the given CA did not sign: refused at connect.
    let other = ClientOptions::new().tls_ca_file(tls_fixture("other-ca.pem"));
    let err = Client::connect("127.0.0.1", worker.port, &other)
        .err()
        .expect("refused");
    assert_eq!(err.code, Code::Unauthenticated, "{err}");
}

#[test]
#[ignore = "needs CHUNKSERVE_WORKER_BIN (ctest sets it)"]
fn refuses_a_revoked_server_certificate() {
    let ca = tls_fixture("ca.pem");
    let start = |cert: &str, key: &str| {
        let (cert, key) = (tls_fixture(cert), tls_fixture(key));
        start_worker_with(&[
            "--tls-ca".as_ref(),
            ca.as_os_str(),
            "--tls-cert".as_ref(),
            cert.as_os_str(),
            "--tls-key".as_ref(),
            key.as_os_str(),
        ])
    };
    let revoked = start("revoked.pem", "revoked.key");
    let good = start("node.pem", "node.key");
    let options = ClientOptions::new()
        .tls_ca_file(ca.clone())
        .tls_crl_file(tls_fixture("crl.pem"));
    let err = Client::connect("127.0.0.1", revoked.port, &options)
        .err()
        .expect("a revoked server is refused");
    assert_eq!(err.code, Code::Unauthenticated, "{err}");
    assert!(err.message.contains("revoked"), "{err}");
    Client::connect("127.0.0.1", good.port, &options).expect("a valid server with the list");
    let other = ClientOptions::new()
        .tls_ca_file(ca.clone())
        .tls_crl_file(tls_fixture("other-crl.pem"));
    let err = Client::connect("127.0.0.1", good.port, &other)
        .err()
        .expect("another CA's list is refused");
    assert_eq!(err.code, Code::InvalidArgument, "{err}");
}
