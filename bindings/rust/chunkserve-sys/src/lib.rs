//! Raw declarations of the chunkserve C ABI (`<chunkserve/chunkserve.h>`, libchunkserve.so).
//!
//! Written by hand, and checked against the header by `tests/header_drift.rs`: every function's
//! parameter and return types, every struct's fields (names, types, and, through the C compiler's
//! own output, offsets and sizes) and every integer constant must match, so drift fails a test.
//! That is why declarations go through the `functions!`, `structs!` and `constants!` macros, which
//! record what they declare.
//!
//! Contracts (ownership, threading, errors) are documented in the header; the safe wrapper is the
//! `chunkserve` crate.
#![allow(non_camel_case_types)]

pub use core::ffi::{c_char, c_void};

/// A struct's layout as Rust sees it, for the drift test.
#[derive(Debug)]
pub struct StructLayout {
    pub name: &'static str,
    pub size: usize,
    pub align: usize,
    pub fields: &'static [FieldLayout],
}

/// One field's layout and declared type.
#[derive(Debug)]
pub struct FieldLayout {
    pub name: &'static str,
    pub ty: &'static str,
    pub offset: usize,
    pub size: usize,
}

macro_rules! constants {
    ($( $(#[$m:meta])* pub const $name:ident : $ty:ty = $val:expr; )*) => {
        $( $(#[$m])* pub const $name: $ty = $val; )*
        /// Every declared constant with its value, for the drift test.
        pub const DECLARED_CONSTANTS: &[(&str, i64)] = &[ $( (stringify!($name), $name as i64), )* ];
    };
}

macro_rules! structs {
    ($( $(#[$m:meta])* pub struct $name:ident { $( $(#[$fm:meta])* pub $field:ident : $fty:ty, )* } )*) => {
        $(
            $(#[$m])*
            #[repr(C)]
            #[derive(Debug, Clone, Copy)]
            pub struct $name { $( $(#[$fm])* pub $field: $fty, )* }
            impl $name {
                /// This struct's layout, for the drift test.
                pub const LAYOUT: StructLayout = StructLayout {
                    name: stringify!($name),
                    size: core::mem::size_of::<$name>(),
                    align: core::mem::align_of::<$name>(),
                    fields: &[ $( FieldLayout {
                        name: stringify!($field),
                        ty: stringify!($fty),
                        offset: core::mem::offset_of!($name, $field),
                        size: core::mem::size_of::<$fty>(),
                    }, )* ],
                };
            }
        )*
        /// Every declared struct's layout, for the drift test.
        pub const DECLARED_STRUCTS: &[&StructLayout] = &[ $( &$name::LAYOUT, )* ];
    };
}

macro_rules! functions {
    ($( $(#[$m:meta])* pub fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)? ; )*) => {
        extern "C" {
            $( $(#[$m])* pub fn $name($($arg: $ty),*) $(-> $ret)?; )*
        }
        /// Every declared function as (name, parameter types, return type), for the drift test.
        pub const DECLARED_FUNCTIONS: &[(&str, &[&str], &str)] = &[
            $( (stringify!($name), &[$(stringify!($ty)),*], functions!(@ret $($ret)?)), )*
        ];
    };
    (@ret) => { "()" };
    (@ret $ret:ty) => { stringify!($ret) };
}

/// `typedef int32_t chunkserve_status_t;`
pub type chunkserve_status_t = i32;

/// Scalar typedefs as (name, Rust type), for the drift test.
pub const DECLARED_TYPEDEFS: &[(&str, &str)] = &[("chunkserve_status_t", "i32")];

/// Opaque handles.
#[repr(C)]
pub struct chunkserve_engine_t {
    _private: [u8; 0],
}
#[repr(C)]
pub struct chunkserve_stream_t {
    _private: [u8; 0],
}
#[repr(C)]
pub struct chunkserve_error_t {
    _private: [u8; 0],
}
#[repr(C)]
pub struct chunkserve_client_t {
    _private: [u8; 0],
}
/// Since 0.3.
#[repr(C)]
pub struct chunkserve_detokenizer_t {
    _private: [u8; 0],
}

/// `typedef void (*chunkserve_stream_callback_t)(const chunkserve_stream_event_t*, void*);`
/// (nullable, hence the Option).
pub type chunkserve_stream_callback_t =
    Option<unsafe extern "C" fn(event: *const chunkserve_stream_event_t, user_data: *mut c_void)>;

/// `typedef void (*chunkserve_log_callback_t)(int32_t severity, const char* message,
/// void* user_data);` (since 0.2; nullable, hence the Option).
pub type chunkserve_log_callback_t =
    Option<unsafe extern "C" fn(severity: i32, message: *const c_char, user_data: *mut c_void)>;

/// The callback typedefs and their parameter types, for the drift test.
pub const CALLBACKS: &[(&str, &[&str])] = &[
    (
        "chunkserve_stream_callback_t",
        &["*const chunkserve_stream_event_t", "*mut c_void"],
    ),
    (
        "chunkserve_log_callback_t",
        &["i32", "*const c_char", "*mut c_void"],
    ),
];

constants! {
    pub const CHUNKSERVE_VERSION_MAJOR: i32 = 0;
    pub const CHUNKSERVE_VERSION_MINOR: i32 = 6;
    pub const CHUNKSERVE_VERSION_PATCH: i32 = 0;
    pub const CHUNKSERVE_ABI_VERSION: i32 = 0;
    pub const CHUNKSERVE_MAX_TOP_LOGPROBS: i32 = 20;

    pub const CHUNKSERVE_LOG_INFO: i32 = 0;
    pub const CHUNKSERVE_LOG_WARNING: i32 = 1;
    pub const CHUNKSERVE_LOG_ERROR: i32 = 2;
    pub const CHUNKSERVE_LOG_FATAL: i32 = 3;

    pub const CHUNKSERVE_STATUS_OK: chunkserve_status_t = 0;
    pub const CHUNKSERVE_STATUS_INVALID_ARGUMENT: chunkserve_status_t = 1;
    pub const CHUNKSERVE_STATUS_NOT_FOUND: chunkserve_status_t = 2;
    pub const CHUNKSERVE_STATUS_ALREADY_EXISTS: chunkserve_status_t = 3;
    pub const CHUNKSERVE_STATUS_RESOURCE_EXHAUSTED: chunkserve_status_t = 4;
    pub const CHUNKSERVE_STATUS_FAILED_PRECONDITION: chunkserve_status_t = 5;
    pub const CHUNKSERVE_STATUS_OUT_OF_RANGE: chunkserve_status_t = 6;
    pub const CHUNKSERVE_STATUS_UNAVAILABLE: chunkserve_status_t = 7;
    pub const CHUNKSERVE_STATUS_DEADLINE_EXCEEDED: chunkserve_status_t = 8;
    pub const CHUNKSERVE_STATUS_CANCELLED: chunkserve_status_t = 9;
    pub const CHUNKSERVE_STATUS_INTERNAL: chunkserve_status_t = 10;
    pub const CHUNKSERVE_STATUS_UNIMPLEMENTED: chunkserve_status_t = 11;
    pub const CHUNKSERVE_STATUS_DATA_LOSS: chunkserve_status_t = 12;
    pub const CHUNKSERVE_STATUS_ABORTED: chunkserve_status_t = 13;
    pub const CHUNKSERVE_STATUS_UNAUTHENTICATED: chunkserve_status_t = 14;

    pub const CHUNKSERVE_FINISH_STOP_TOKEN: i32 = 0;
    pub const CHUNKSERVE_FINISH_LENGTH: i32 = 1;
    pub const CHUNKSERVE_FINISH_CANCELLED: i32 = 2;
    pub const CHUNKSERVE_FINISH_DEADLINE: i32 = 3;
    pub const CHUNKSERVE_FINISH_ERROR: i32 = 4;
    pub const CHUNKSERVE_FINISH_UNAVAILABLE: i32 = 5;

    pub const CHUNKSERVE_BACKEND_CPU: i32 = 0;
    pub const CHUNKSERVE_BACKEND_CUDA: i32 = 1;

    pub const CHUNKSERVE_DTYPE_F32: i32 = 0;
    pub const CHUNKSERVE_DTYPE_F16: i32 = 1;
    pub const CHUNKSERVE_DTYPE_BF16: i32 = 2;

    pub const CHUNKSERVE_SHUTDOWN_DRAIN: i32 = 0;
    pub const CHUNKSERVE_SHUTDOWN_ABORT: i32 = 1;

    pub const CHUNKSERVE_EVENT_TOKEN: i32 = 0;
    pub const CHUNKSERVE_EVENT_FINISHED: i32 = 1;

    pub const CHUNKSERVE_WAIT_FOREVER: i64 = -1;
}

structs! {
    /// Engine options (version 1: 56 bytes; version 2 adds tiny_model: 64 bytes).
    pub struct chunkserve_engine_options_t {
        pub struct_size: u32,
        pub backend: i32,
        pub model_path: *const c_char,
        pub kv_cache_bytes: u64,
        pub chunk_size: i32,
        pub kv_dtype: i32,
        pub enable_prefix_sharing: i32,
        pub num_threads: i32,
        pub max_batch_size: i32,
        pub prefill_token_budget: i32,
        pub max_queued_requests: i32,
        pub reserved0: i32,
        /// Since version 2 (0.4).
        pub tiny_model: i32,
        /// Since 0.5 (0.4 named it reserved1 and required 0, which is F32).
        pub gguf_dtype: i32,
    }

    /// Request options (version 1: 72 bytes; version 2 adds logprobs: 80 bytes).
    pub struct chunkserve_request_options_t {
        pub struct_size: u32,
        pub max_new_tokens: i32,
        pub prompt_tokens: *const i32,
        pub num_prompt_tokens: u64,
        pub stop_tokens: *const i32,
        pub num_stop_tokens: u64,
        pub temperature: f32,
        pub top_k: i32,
        pub top_p: f32,
        pub priority: i32,
        pub seed: u64,
        pub deadline_ms: u64,
        /// Since version 2 (0.4).
        pub logprobs: i32,
        pub reserved0: i32,
    }

    /// Engine statistics (version 1: 160 bytes).
    pub struct chunkserve_engine_stats_t {
        pub struct_size: u32,
        pub running: i32,
        pub requests_submitted: u64,
        pub requests_finished: u64,
        pub prompt_tokens: u64,
        pub prefix_hit_tokens: u64,
        pub prefill_tokens: u64,
        pub generated_tokens: u64,
        pub steps: u64,
        pub evicted_chunks: u64,
        pub preemptions: u64,
        pub queued: i32,
        pub last_batch_size: i32,
        pub kv_bytes_used: u64,
        pub kv_bytes_referenced: u64,
        pub kv_bytes_if_unshared: u64,
        pub kv_bytes_capacity: u64,
        pub kv_bytes_peak: u64,
        pub chunks_total: i32,
        pub chunks_shared: i32,
        pub chunks_retained: i32,
        pub reserved0: i32,
        pub decode_tokens_per_s: f64,
        pub prefill_tokens_per_s: f64,
    }

    /// Model facts (version 1: 24 bytes).
    pub struct chunkserve_engine_info_t {
        pub struct_size: u32,
        pub vocab_size: i32,
        pub max_context: i32,
        pub chunk_size: i32,
        pub model_fingerprint: u64,
    }

    /// One stream event (version 1: 48 bytes; version 2 adds the logprobs of TOKEN events: 216).
    pub struct chunkserve_stream_event_t {
        pub struct_size: u32,
        pub kind: i32,
        pub token: i32,
        pub index: i32,
        pub finish_reason: i32,
        pub status: chunkserve_status_t,
        pub prompt_tokens: i32,
        pub cached_tokens: i32,
        pub generated_tokens: i32,
        pub reserved0: i32,
        pub error_message: *const c_char,
        /// Since version 2 (0.4).
        pub num_top_logprobs: i32,
        pub logprob: f32,
        pub top_tokens: [i32; 20],
        pub top_logprobs: [f32; 20],
    }

    /// Remote client options (version 1: 24 bytes; version 2 adds the TLS files: 48 bytes;
    /// version 3 the revocation list file: 56 bytes).
    pub struct chunkserve_client_options_t {
        pub struct_size: u32,
        pub port: i32,
        pub host: *const c_char,
        pub connect_timeout_ms: i32,
        pub keepalive_interval_ms: i32,
        pub tls_ca_file: *const c_char,
        pub tls_cert_file: *const c_char,
        pub tls_key_file: *const c_char,
        pub tls_crl_file: *const c_char,
    }
}

functions! {
    pub fn chunkserve_status_name(status: chunkserve_status_t) -> *const c_char;

    pub fn chunkserve_error_code(error: *const chunkserve_error_t) -> chunkserve_status_t;
    pub fn chunkserve_error_message(error: *const chunkserve_error_t) -> *const c_char;
    pub fn chunkserve_error_free(error: *mut chunkserve_error_t);

    pub fn chunkserve_version() -> *const c_char;
    pub fn chunkserve_abi_version() -> i32;
    pub fn chunkserve_set_log_callback(
        callback: chunkserve_log_callback_t,
        user_data: *mut c_void,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;

    pub fn chunkserve_finish_reason_name(finish_reason: i32) -> *const c_char;

    pub fn chunkserve_engine_options_init(
        options: *mut chunkserve_engine_options_t,
        struct_size: u32,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_engine_create(
        options: *const chunkserve_engine_options_t,
        out_engine: *mut *mut chunkserve_engine_t,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_engine_destroy(engine: *mut chunkserve_engine_t);
    pub fn chunkserve_engine_shutdown(
        engine: *mut chunkserve_engine_t,
        mode: i32,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_request_options_init(
        options: *mut chunkserve_request_options_t,
        struct_size: u32,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_engine_submit(
        engine: *mut chunkserve_engine_t,
        request: *const chunkserve_request_options_t,
        out_stream: *mut *mut chunkserve_stream_t,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_engine_cancel(
        engine: *mut chunkserve_engine_t,
        request_id: u64,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_engine_stats(
        engine: *mut chunkserve_engine_t,
        stats: *mut chunkserve_engine_stats_t,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_engine_info(
        engine: *mut chunkserve_engine_t,
        info: *mut chunkserve_engine_info_t,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;

    pub fn chunkserve_stream_id(stream: *const chunkserve_stream_t) -> u64;
    pub fn chunkserve_stream_next(
        stream: *mut chunkserve_stream_t,
        timeout_ms: i64,
        event: *mut chunkserve_stream_event_t,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_stream_set_callback(
        stream: *mut chunkserve_stream_t,
        callback: chunkserve_stream_callback_t,
        user_data: *mut c_void,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_stream_cancel(
        stream: *mut chunkserve_stream_t,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_stream_destroy(stream: *mut chunkserve_stream_t);

    pub fn chunkserve_client_options_init(
        options: *mut chunkserve_client_options_t,
        struct_size: u32,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_client_create(
        options: *const chunkserve_client_options_t,
        out_client: *mut *mut chunkserve_client_t,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_client_destroy(client: *mut chunkserve_client_t);
    pub fn chunkserve_client_submit(
        client: *mut chunkserve_client_t,
        request: *const chunkserve_request_options_t,
        out_stream: *mut *mut chunkserve_stream_t,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_client_cancel(
        client: *mut chunkserve_client_t,
        request_id: u64,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;

    // Text (since 0.3). `size_t` is `usize` (the same size and alignment on every target Rust
    // supports); the drift test maps it so.
    pub fn chunkserve_tokenize(
        engine: *mut chunkserve_engine_t,
        text: *const c_char,
        text_len: usize,
        add_special_tokens: i32,
        ids: *mut i32,
        capacity: usize,
        num_ids: *mut usize,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_detokenize(
        engine: *mut chunkserve_engine_t,
        ids: *const i32,
        num_ids: usize,
        skip_special_tokens: i32,
        text: *mut c_char,
        capacity: usize,
        text_len: *mut usize,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_detokenizer_create(
        engine: *mut chunkserve_engine_t,
        skip_special_tokens: i32,
        out_detokenizer: *mut *mut chunkserve_detokenizer_t,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_detokenizer_push(
        detokenizer: *mut chunkserve_detokenizer_t,
        id: i32,
        text: *mut c_char,
        capacity: usize,
        text_len: *mut usize,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_detokenizer_flush(
        detokenizer: *mut chunkserve_detokenizer_t,
        text: *mut c_char,
        capacity: usize,
        text_len: *mut usize,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_detokenizer_destroy(detokenizer: *mut chunkserve_detokenizer_t);
    pub fn chunkserve_apply_chat_template(
        engine: *mut chunkserve_engine_t,
        roles: *const *const c_char,
        contents: *const *const c_char,
        num_messages: usize,
        add_generation_prompt: i32,
        text: *mut c_char,
        capacity: usize,
        text_len: *mut usize,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
    pub fn chunkserve_engine_eos_ids(
        engine: *mut chunkserve_engine_t,
        ids: *mut i32,
        capacity: usize,
        num_ids: *mut usize,
        out_error: *mut *mut chunkserve_error_t,
    ) -> chunkserve_status_t;
}
