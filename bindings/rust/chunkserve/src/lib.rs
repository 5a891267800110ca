//! Embed the chunkserve LLM serving engine: a safe API over its stable C ABI (libchunkserve.so).
//!
//! ```no_run
//! use chunkserve::{Engine, EngineOptions, Request};
//!
//! let engine = Engine::new(&EngineOptions::new().model_path("/models/smollm2.gguf").kv_cache_bytes(64 << 20))?;
//! let prompt = [1, 2, 3, 4];
//! let mut stream = engine.submit(&Request::new(&prompt).max_new_tokens(8))?;
//! for token in stream.by_ref() {
//!     println!("{}", token?);
//! }
//! println!("{:?}", stream.finish());
//! println!("{} tokens generated", engine.stats()?.generated_tokens);
//! # Ok::<(), chunkserve::Error>(())
//! ```
//!
//! **Options** ([`EngineOptions`], [`Request`], [`ClientOptions`]) are `#[non_exhaustive]`, so
//! that later versions can add fields: start from `new()` / `Default::default()` and set fields
//! with the builder methods of the same names (as above) or by assignment
//! (`let mut o = EngineOptions::default(); o.chunk_size = 16;`); struct literals do not compile
//! outside this crate. The enums ([`Code`], [`FinishReason`], [`Event`], [`Backend`], [`DType`],
//! [`ShutdownMode`]) and the structs the library fills ([`Finish`], [`Info`], [`EngineStats`],
//! [`Error`]) are `#[non_exhaustive]` too: a `match` needs a `_` arm, and new variants or fields
//! are not breaking changes.
//!
//! A model is required: `EngineOptions::model_path`, or `tiny_model(true)` for the built-in tiny
//! random-weight model (vocab 1024). Handles free their C objects on drop. [`Engine`] is `Send + Sync` (the C engine handle
//! is thread-safe); [`Stream`] is `Send + Sync` too (its `&self` methods are thread-safe in C; its
//! `&mut self` methods pull events). A stream may outlive its engine: it then ends with
//! [`FinishReason::Unavailable`]. To cancel a stream that another thread is reading, call
//! [`Engine::cancel`] with [`Stream::id`].
//!
//! Linking: the `chunkserve-sys` crate links `libchunkserve.so` from `CHUNKSERVE_LIB_DIR`, else
//! from `pkg-config --libs chunkserve` (`PKG_CONFIG_PATH` applies); without either the build
//! fails with a message that says how to fix it.
use std::ffi::{CStr, CString};
use std::fmt;
use std::mem::size_of;
use std::os::raw::c_void;
use std::path::PathBuf;
use std::ptr::{self, NonNull};
use std::time::Duration;

use chunkserve_sys as sys;

/// A chunkserve status code (the C ABI's `CHUNKSERVE_STATUS_*`). Non-exhaustive: the C ABI may
/// add codes, which later versions of this crate add as variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    ResourceExhausted,
    FailedPrecondition,
    OutOfRange,
    Unavailable,
    DeadlineExceeded,
    Cancelled,
    Internal,
    Unimplemented,
    DataLoss,
    Aborted,
    Unauthenticated,
    /// A code this version of the crate does not know (treat like `Internal`).
    Unknown(i32),
}

impl Code {
    /// The code for a raw non-OK status.
    pub fn from_raw(status: sys::chunkserve_status_t) -> Code {
        match status {
            sys::CHUNKSERVE_STATUS_INVALID_ARGUMENT => Code::InvalidArgument,
            sys::CHUNKSERVE_STATUS_NOT_FOUND => Code::NotFound,
            sys::CHUNKSERVE_STATUS_ALREADY_EXISTS => Code::AlreadyExists,
            sys::CHUNKSERVE_STATUS_RESOURCE_EXHAUSTED => Code::ResourceExhausted,
            sys::CHUNKSERVE_STATUS_FAILED_PRECONDITION => Code::FailedPrecondition,
            sys::CHUNKSERVE_STATUS_OUT_OF_RANGE => Code::OutOfRange,
            sys::CHUNKSERVE_STATUS_UNAVAILABLE => Code::Unavailable,
            sys::CHUNKSERVE_STATUS_DEADLINE_EXCEEDED => Code::DeadlineExceeded,
            sys::CHUNKSERVE_STATUS_CANCELLED => Code::Cancelled,
            sys::CHUNKSERVE_STATUS_INTERNAL => Code::Internal,
            sys::CHUNKSERVE_STATUS_UNIMPLEMENTED => Code::Unimplemented,
            sys::CHUNKSERVE_STATUS_DATA_LOSS => Code::DataLoss,
            sys::CHUNKSERVE_STATUS_ABORTED => Code::Aborted,
            sys::CHUNKSERVE_STATUS_UNAUTHENTICATED => Code::Unauthenticated,
            other => Code::Unknown(other),
        }
    }

    /// The raw status value.
    pub fn raw(self) -> sys::chunkserve_status_t {
        match self {
            Code::InvalidArgument => sys::CHUNKSERVE_STATUS_INVALID_ARGUMENT,
            Code::NotFound => sys::CHUNKSERVE_STATUS_NOT_FOUND,
            Code::AlreadyExists => sys::CHUNKSERVE_STATUS_ALREADY_EXISTS,
            Code::ResourceExhausted => sys::CHUNKSERVE_STATUS_RESOURCE_EXHAUSTED,
            Code::FailedPrecondition => sys::CHUNKSERVE_STATUS_FAILED_PRECONDITION,
            Code::OutOfRange => sys::CHUNKSERVE_STATUS_OUT_OF_RANGE,
            Code::Unavailable => sys::CHUNKSERVE_STATUS_UNAVAILABLE,
            Code::DeadlineExceeded => sys::CHUNKSERVE_STATUS_DEADLINE_EXCEEDED,
            Code::Cancelled => sys::CHUNKSERVE_STATUS_CANCELLED,
            Code::Internal => sys::CHUNKSERVE_STATUS_INTERNAL,
            Code::Unimplemented => sys::CHUNKSERVE_STATUS_UNIMPLEMENTED,
            Code::DataLoss => sys::CHUNKSERVE_STATUS_DATA_LOSS,
            Code::Aborted => sys::CHUNKSERVE_STATUS_ABORTED,
            Code::Unauthenticated => sys::CHUNKSERVE_STATUS_UNAUTHENTICATED,
            Code::Unknown(raw) => raw,
        }
    }

    /// The stable name, e.g. "INVALID_ARGUMENT".
    pub fn name(self) -> &'static str {
        // SAFETY: chunkserve_status_name returns a static NUL-terminated string for any value.
        unsafe { static_str(sys::chunkserve_status_name(self.raw())) }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An error reported by libchunkserve: a code and a message. Non-exhaustive (later versions may
/// add details): build one with [`Error::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Error {
    pub code: Code,
    pub message: String,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }
    pub fn code(&self) -> Code {
        self.code
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chunkserve: {}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// # Safety
/// `p` must be null or a NUL-terminated string that lives for the rest of the program.
unsafe fn static_str(p: *const std::os::raw::c_char) -> &'static str {
    if p.is_null() {
        return "";
    }
    CStr::from_ptr(p).to_str().unwrap_or("")
}

/// Turns a status and an optional C error object into a Result, freeing the object.
fn check(status: sys::chunkserve_status_t, error: *mut sys::chunkserve_error_t) -> Result<()> {
    let message = if error.is_null() {
        String::new()
    } else {
        // SAFETY: error is a live error object from the library; freed right after use.
        unsafe {
            let m = CStr::from_ptr(sys::chunkserve_error_message(error))
                .to_string_lossy()
                .into_owned();
            sys::chunkserve_error_free(error);
            m
        }
    };
    if status == sys::CHUNKSERVE_STATUS_OK {
        return Ok(());
    }
    Err(Error {
        code: Code::from_raw(status),
        message,
    })
}

/// Calls `f` with a fresh error out-parameter and converts the outcome.
fn call(
    f: impl FnOnce(*mut *mut sys::chunkserve_error_t) -> sys::chunkserve_status_t,
) -> Result<()> {
    let mut error = ptr::null_mut();
    let status = f(&mut error);
    check(status, error)
}

/// The library's release, "MAJOR.MINOR.PATCH".
pub fn version() -> &'static str {
    // SAFETY: a static string.
    unsafe { static_str(sys::chunkserve_version()) }
}

/// The library's ABI generation; equals [`HEADER_ABI_VERSION`] unless mismatched.
pub fn abi_version() -> i32 {
    // SAFETY: no arguments, no state.
    unsafe { sys::chunkserve_abi_version() }
}

/// The ABI generation these bindings were written for.
pub const HEADER_ABI_VERSION: i32 = sys::CHUNKSERVE_ABI_VERSION;

/// Where the engine computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Backend {
    #[default]
    Cpu,
    Cuda,
}

/// KV cache element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DType {
    #[default]
    F32,
    F16,
    BF16,
}

/// What [`Engine::shutdown`] does with requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShutdownMode {
    /// Stop admitting; finish every submitted request.
    Drain,
    /// End every request now with [`FinishReason::Unavailable`].
    Abort,
}

/// Engine configuration; zero values mean the defaults. Non-exhaustive: start from
/// [`EngineOptions::new`] (or `Default::default()`), then use the builder methods or assign fields.
///
/// ```
/// use chunkserve::EngineOptions;
/// let options = EngineOptions::new().kv_cache_bytes(64 << 20).chunk_size(16);
/// let mut same = EngineOptions::default();
/// same.kv_cache_bytes = 64 << 20;
/// same.chunk_size = 16;
/// assert_eq!((options.kv_cache_bytes, options.chunk_size), (same.kv_cache_bytes, same.chunk_size));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EngineOptions {
    /// Directory with config.json and safetensors weights, or a .gguf file; required unless
    /// `tiny_model`.
    pub model_path: Option<PathBuf>,
    /// The built-in tiny random-weight model (vocab 1024; tests, demos) instead of `model_path`.
    /// Random weights are never a silent fallback.
    pub tiny_model: bool,
    pub backend: Backend,
    /// KV cache size in bytes; 0: 256 MiB.
    pub kv_cache_bytes: u64,
    /// Tokens per KV chunk (16..256); 0: 64.
    pub chunk_size: i32,
    pub kv_dtype: DType,
    /// What a .gguf model's tensors are dequantized to (default F32); the CPU backend keeps F16 /
    /// BF16 weights half-size. Ignored for safetensors. Needs library 0.5.
    pub gguf_dtype: DType,
    /// Reuse cached prompt prefixes across requests (default true).
    pub prefix_sharing: bool,
    /// CPU backend threads; 0: hardware concurrency.
    pub num_threads: i32,
    /// Sequences per step; 0: 64.
    pub max_batch_size: i32,
    /// Tokens per step; 0: 512; negative: unlimited.
    pub prefill_token_budget: i32,
    /// Queue bound (submit fails with ResourceExhausted beyond it); 0: 4096.
    pub max_queued_requests: i32,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            model_path: None,
            tiny_model: false,
            backend: Backend::Cpu,
            kv_cache_bytes: 0,
            chunk_size: 0,
            kv_dtype: DType::F32,
            gguf_dtype: DType::F32,
            prefix_sharing: true,
            num_threads: 0,
            max_batch_size: 0,
            prefill_token_budget: 0,
            max_queued_requests: 0,
        }
    }
}

/// Builder methods that set a field of the same name and return the options.
macro_rules! setters {
    ($( $(#[$m:meta])* $field:ident : $ty:ty ),* $(,)?) => {
        $(
            $(#[$m])*
            #[must_use]
            pub fn $field(mut self, value: $ty) -> Self {
                self.$field = value;
                self
            }
        )*
    };
}

impl EngineOptions {
    /// The defaults: no model yet (set `model_path`, or `tiny_model`), the CPU, every size at its
    /// default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves the model in `path` (config.json and safetensors weights).
    #[must_use]
    pub fn model_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.model_path = Some(path.into());
        self
    }

    setters! {
        /// Sets [`EngineOptions::tiny_model`](#structfield.tiny_model).
        tiny_model: bool,
        /// Sets [`EngineOptions::backend`](#structfield.backend).
        backend: Backend,
        /// Sets [`EngineOptions::kv_cache_bytes`](#structfield.kv_cache_bytes).
        kv_cache_bytes: u64,
        /// Sets [`EngineOptions::chunk_size`](#structfield.chunk_size).
        chunk_size: i32,
        /// Sets [`EngineOptions::kv_dtype`](#structfield.kv_dtype).
        kv_dtype: DType,
        /// Sets [`EngineOptions::gguf_dtype`](#structfield.gguf_dtype).
        gguf_dtype: DType,
        /// Sets [`EngineOptions::prefix_sharing`](#structfield.prefix_sharing).
        prefix_sharing: bool,
        /// Sets [`EngineOptions::num_threads`](#structfield.num_threads).
        num_threads: i32,
        /// Sets [`EngineOptions::max_batch_size`](#structfield.max_batch_size).
        max_batch_size: i32,
        /// Sets [`EngineOptions::prefill_token_budget`](#structfield.prefill_token_budget).
        prefill_token_budget: i32,
        /// Sets [`EngineOptions::max_queued_requests`](#structfield.max_queued_requests).
        max_queued_requests: i32,
    }
}

/// An in-process chunkserve engine. Dropping it stops it: requests in flight end with
/// [`FinishReason::Unavailable`], and their streams stay usable.
pub struct Engine {
    ptr: NonNull<sys::chunkserve_engine_t>,
}

// SAFETY: the C contract makes the engine handle safe to use from any thread at once; only
// destroy must not overlap other calls, and Drop has exclusive access.
unsafe impl Send for Engine {}
unsafe impl Sync for Engine {}

impl Engine {
    /// Creates an engine and starts its step thread.
    pub fn new(options: &EngineOptions) -> Result<Engine> {
        // SAFETY: zeroed is a valid bit pattern for the plain C struct; init overwrites it.
        let mut o: sys::chunkserve_engine_options_t = unsafe { std::mem::zeroed() };
        call(|e| unsafe {
            sys::chunkserve_engine_options_init(
                &mut o,
                size_of::<sys::chunkserve_engine_options_t>() as u32,
                e,
            )
        })?;
        o.backend = match options.backend {
            Backend::Cpu => sys::CHUNKSERVE_BACKEND_CPU,
            Backend::Cuda => sys::CHUNKSERVE_BACKEND_CUDA,
        };
        o.kv_cache_bytes = options.kv_cache_bytes;
        o.chunk_size = options.chunk_size;
        o.kv_dtype = match options.kv_dtype {
            DType::F32 => sys::CHUNKSERVE_DTYPE_F32,
            DType::F16 => sys::CHUNKSERVE_DTYPE_F16,
            DType::BF16 => sys::CHUNKSERVE_DTYPE_BF16,
        };
        o.gguf_dtype = match options.gguf_dtype {
            DType::F32 => sys::CHUNKSERVE_DTYPE_F32,
            DType::F16 => sys::CHUNKSERVE_DTYPE_F16,
            DType::BF16 => sys::CHUNKSERVE_DTYPE_BF16,
        };
        o.enable_prefix_sharing = options.prefix_sharing as i32;
        o.num_threads = options.num_threads;
        o.max_batch_size = options.max_batch_size;
        if options.prefill_token_budget < 0 {
            o.prefill_token_budget = 0;
        } else if options.prefill_token_budget > 0 {
            o.prefill_token_budget = options.prefill_token_budget;
        }
        o.max_queued_requests = options.max_queued_requests;
        o.tiny_model = options.tiny_model as i32;
        let path = match &options.model_path {
            Some(p) => Some(CString::new(p.to_string_lossy().into_owned()).map_err(|_| {
                Error::new(Code::InvalidArgument, "model_path contains a NUL byte")
            })?),
            None => None,
        };
        o.model_path = path.as_ref().map_or(ptr::null(), |p| p.as_ptr());
        let mut raw = ptr::null_mut();
        // SAFETY: o and path outlive the call; raw receives a new engine on success.
        call(|e| unsafe { sys::chunkserve_engine_create(&o, &mut raw, e) })?;
        let ptr = NonNull::new(raw).ok_or_else(|| Error::new(Code::Internal, "null engine"))?;
        Ok(Engine { ptr })
    }

    /// Validates and enqueues a request; the stream yields its tokens.
    pub fn submit(&self, request: &Request<'_>) -> Result<Stream> {
        let r = c_request(request)?;
        let mut raw = ptr::null_mut();
        // SAFETY: the token slices outlive the call (the library copies them).
        call(|e| unsafe { sys::chunkserve_engine_submit(self.ptr.as_ptr(), &r, &mut raw, e) })?;
        Stream::from_raw(raw)
    }

    /// Cancels the live request with that id ([`Stream::id`]); `NotFound` when none is live.
    pub fn cancel(&self, request_id: u64) -> Result<()> {
        // SAFETY: a live engine handle.
        call(|e| unsafe { sys::chunkserve_engine_cancel(self.ptr.as_ptr(), request_id, e) })
    }

    /// Stops the engine; see [`ShutdownMode`]. Afterwards submit fails with `Unavailable`.
    pub fn shutdown(&self, mode: ShutdownMode) -> Result<()> {
        let mode = match mode {
            ShutdownMode::Drain => sys::CHUNKSERVE_SHUTDOWN_DRAIN,
            ShutdownMode::Abort => sys::CHUNKSERVE_SHUTDOWN_ABORT,
        };
        // SAFETY: a live engine handle.
        call(|e| unsafe { sys::chunkserve_engine_shutdown(self.ptr.as_ptr(), mode, e) })
    }

    /// Counters and gauges; see [`EngineStats`]. Works from any thread, also after
    /// [`Engine::shutdown`].
    pub fn stats(&self) -> Result<EngineStats> {
        // SAFETY: zeroed is valid for the plain C struct; the library fills it.
        let mut s: sys::chunkserve_engine_stats_t = unsafe { std::mem::zeroed() };
        s.struct_size = size_of::<sys::chunkserve_engine_stats_t>() as u32;
        call(|e| unsafe { sys::chunkserve_engine_stats(self.ptr.as_ptr(), &mut s, e) })?;
        Ok(EngineStats::from_c(&s))
    }

    /// Facts about the served model.
    pub fn info(&self) -> Result<Info> {
        // SAFETY: as in stats().
        let mut i: sys::chunkserve_engine_info_t = unsafe { std::mem::zeroed() };
        i.struct_size = size_of::<sys::chunkserve_engine_info_t>() as u32;
        call(|e| unsafe { sys::chunkserve_engine_info(self.ptr.as_ptr(), &mut i, e) })?;
        Ok(Info {
            vocab_size: i.vocab_size,
            max_context: i.max_context,
            chunk_size: i.chunk_size,
            model_fingerprint: i.model_fingerprint,
        })
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: we own the handle and nothing else can be using it (&mut self).
        unsafe { sys::chunkserve_engine_destroy(self.ptr.as_ptr()) }
    }
}

// ---- Text (C ABI 0.3) ---------------------------------------------------------------------------

/// One turn of a conversation for [`Engine::apply_chat_template`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// "system", "user" or "assistant".
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Runs a C function that fills a buffer under the ABI's sizing contract (it reports the whole
/// result's size and returns `OUT_OF_RANGE` when the buffer is too small): first with `guess`
/// elements, then, if that was too small, once more with the size it asked for.
fn call_sized<T: Copy + Default>(
    guess: usize,
    mut f: impl FnMut(*mut T, usize, *mut usize, *mut *mut sys::chunkserve_error_t) -> i32,
) -> Result<Vec<T>> {
    let mut buf = vec![T::default(); guess.max(1)];
    let mut size = 0usize;
    let mut error = ptr::null_mut();
    let mut status = f(buf.as_mut_ptr(), buf.len(), &mut size, &mut error);
    if status == sys::CHUNKSERVE_STATUS_OUT_OF_RANGE && size > buf.len() {
        let _ = check(status, error); // frees the error object
        buf = vec![T::default(); size];
        error = ptr::null_mut();
        status = f(buf.as_mut_ptr(), buf.len(), &mut size, &mut error);
    }
    check(status, error)?;
    buf.truncate(size);
    Ok(buf)
}

/// The library's text is UTF-8 by contract; anything else is a bug there.
fn utf8(bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        Error::new(
            Code::Internal,
            format!("the library returned invalid UTF-8: {e}"),
        )
    })
}

fn c_string(what: &str, s: &str) -> Result<CString> {
    CString::new(s)
        .map_err(|_| Error::new(Code::InvalidArgument, format!("{what} contains a NUL byte")))
}

/// Text: the served model's tokenizer, chat template and end-of-answer ids, loaded from
/// `model_path` on the first such call. An engine without tokenizer files fails each call with
/// `FailedPrecondition` (the built-in tiny model) or `NotFound` (a model folder without
/// tokenizer.json), and the message says what is missing.
impl Engine {
    /// Encodes UTF-8 text into the model's token ids. Special tokens written in the text
    /// (`"<|im_start|>"`) become their ids; `add_special_tokens` adds what the tokenizer adds around
    /// a text (a BOS token for Llama-style vocabularies).
    pub fn tokenize(&self, text: &str, add_special_tokens: bool) -> Result<Vec<i32>> {
        // A token covers at least one byte, plus a few the tokenizer may add.
        call_sized(text.len() + 4, |buf, capacity, size, e| unsafe {
            // SAFETY: text and buf outlive the call; capacity is buf's length.
            sys::chunkserve_tokenize(
                self.ptr.as_ptr(),
                text.as_ptr().cast(),
                text.len(),
                add_special_tokens as i32,
                buf,
                capacity,
                size,
                e,
            )
        })
    }

    /// Decodes token ids into text; `skip_special_tokens` leaves out special tokens such as
    /// `<|im_end|>`. `InvalidArgument` for an id outside the vocabulary.
    pub fn detokenize(&self, ids: &[i32], skip_special_tokens: bool) -> Result<String> {
        let bytes = call_sized(
            8 * ids.len() + 16,
            |buf: *mut u8, capacity, size, e| unsafe {
                // SAFETY: ids and buf outlive the call; capacity is buf's length.
                sys::chunkserve_detokenize(
                    self.ptr.as_ptr(),
                    ids.as_ptr(),
                    ids.len(),
                    skip_special_tokens as i32,
                    buf.cast(),
                    capacity,
                    size,
                    e,
                )
            },
        )?;
        utf8(bytes)
    }

    /// A streaming detokenizer over this engine's tokenizer (it may outlive the engine).
    pub fn detokenizer(&self, skip_special_tokens: bool) -> Result<Detokenizer> {
        let mut raw = ptr::null_mut();
        // SAFETY: a live engine handle; raw receives a new detokenizer on success.
        call(|e| unsafe {
            sys::chunkserve_detokenizer_create(
                self.ptr.as_ptr(),
                skip_special_tokens as i32,
                &mut raw,
                e,
            )
        })?;
        let ptr =
            NonNull::new(raw).ok_or_else(|| Error::new(Code::Internal, "null detokenizer"))?;
        Ok(Detokenizer { ptr })
    }

    /// Renders a conversation with the model's chat template, as transformers'
    /// `apply_chat_template` does; `add_generation_prompt` appends the start of an assistant turn.
    /// Tokenize the result with `add_special_tokens` false (it holds the special tokens as text).
    /// `FailedPrecondition` when the model has no chat template; `InvalidArgument` for a
    /// conversation the template refuses or a string with a NUL byte.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let roles = messages
            .iter()
            .map(|m| c_string("a role", &m.role))
            .collect::<Result<Vec<_>>>()?;
        let contents = messages
            .iter()
            .map(|m| c_string("a content", &m.content))
            .collect::<Result<Vec<_>>>()?;
        let role_ptrs: Vec<*const std::os::raw::c_char> =
            roles.iter().map(|s| s.as_ptr()).collect();
        let content_ptrs: Vec<*const std::os::raw::c_char> =
            contents.iter().map(|s| s.as_ptr()).collect();
        let guess = 256
            + messages
                .iter()
                .map(|m| m.role.len() + m.content.len() + 32)
                .sum::<usize>();
        let bytes = call_sized(guess, |buf: *mut u8, capacity, size, e| unsafe {
            // SAFETY: the strings, the pointer arrays and buf outlive the call.
            sys::chunkserve_apply_chat_template(
                self.ptr.as_ptr(),
                role_ptrs.as_ptr(),
                content_ptrs.as_ptr(),
                messages.len(),
                add_generation_prompt as i32,
                buf.cast(),
                capacity,
                size,
                e,
            )
        })?;
        utf8(bytes)
    }

    /// The ids that end an answer (the model's EOS token and its chat template's end-of-turn
    /// token), sorted: use them as the request's stop tokens.
    pub fn eos_ids(&self) -> Result<Vec<i32>> {
        call_sized(8, |buf, capacity, size, e| unsafe {
            // SAFETY: buf outlives the call; capacity is its length.
            sys::chunkserve_engine_eos_ids(self.ptr.as_ptr(), buf, capacity, size, e)
        })
    }
}

/// Turns the ids of one generated sequence into text as they arrive: every piece is valid UTF-8
/// (the bytes of a character split over several tokens are held back until it is complete), and
/// the pieces of all [`push`](Detokenizer::push) calls and the final
/// [`flush`](Detokenizer::flush) add up to [`Engine::detokenize`] of all the ids. It holds the
/// engine's tokenizer itself, so it may outlive the engine. Freed on drop.
pub struct Detokenizer {
    ptr: NonNull<sys::chunkserve_detokenizer_t>,
}

// SAFETY: the C detokenizer may be used from any thread, one call at a time; every method takes
// &mut self, so Rust's aliasing rules already serialize the calls.
unsafe impl Send for Detokenizer {}
unsafe impl Sync for Detokenizer {}

impl Detokenizer {
    /// Adds one id and returns the text it completes (possibly empty). A refused id
    /// (`InvalidArgument`: outside the vocabulary) is not taken.
    pub fn push(&mut self, id: i32) -> Result<String> {
        // A refused call leaves the C detokenizer unchanged, so the retry is the same push.
        let bytes = call_sized(64, |buf: *mut u8, capacity, size, e| unsafe {
            // SAFETY: a live detokenizer (&mut self: no other call at once); buf outlives the call.
            sys::chunkserve_detokenizer_push(self.ptr.as_ptr(), id, buf.cast(), capacity, size, e)
        })?;
        utf8(bytes)
    }

    /// Returns the text still held back (bytes of an unfinished character become U+FFFD) and
    /// empties the detokenizer, which may then start a new sequence.
    pub fn flush(&mut self) -> Result<String> {
        let bytes = call_sized(64, |buf: *mut u8, capacity, size, e| unsafe {
            // SAFETY: as in push().
            sys::chunkserve_detokenizer_flush(self.ptr.as_ptr(), buf.cast(), capacity, size, e)
        })?;
        utf8(bytes)
    }
}

impl Drop for Detokenizer {
    fn drop(&mut self) {
        // SAFETY: we own the handle and nothing else can be using it (&mut self).
        unsafe { sys::chunkserve_detokenizer_destroy(self.ptr.as_ptr()) }
    }
}

/// The C request options for `request`, pointing into its token slices (which must outlive the
/// submit call).
fn c_request(request: &Request<'_>) -> Result<sys::chunkserve_request_options_t> {
    // SAFETY: zeroed is a valid bit pattern for the plain C struct; init overwrites it.
    let mut r: sys::chunkserve_request_options_t = unsafe { std::mem::zeroed() };
    call(|e| unsafe {
        sys::chunkserve_request_options_init(
            &mut r,
            size_of::<sys::chunkserve_request_options_t>() as u32,
            e,
        )
    })?;
    r.prompt_tokens = request.prompt.as_ptr();
    r.num_prompt_tokens = request.prompt.len() as u64;
    r.stop_tokens = request.stop_tokens.as_ptr();
    r.num_stop_tokens = request.stop_tokens.len() as u64;
    if request.max_new_tokens != 0 {
        r.max_new_tokens = request.max_new_tokens;
    }
    r.temperature = request.temperature;
    r.top_k = request.top_k;
    if request.top_p != 0.0 {
        r.top_p = request.top_p;
    }
    r.seed = request.seed;
    r.priority = request.priority;
    if let Some(t) = request.timeout {
        // Rounded up, so a non-zero timeout never becomes 0 (= no deadline).
        r.deadline_ms = (t.as_nanos().div_ceil(1_000_000)).clamp(1, u64::MAX as u128) as u64;
    }
    r.logprobs = request.logprobs.unwrap_or(-1);
    Ok(r)
}

/// Options of [`Client::connect`]; zero values mean the defaults. Non-exhaustive: start from
/// [`ClientOptions::new`] (or `Default::default()`), then use the builder methods or assign fields.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Bound on connecting; None: 5 s.
    pub connect_timeout: Option<Duration>,
    /// How often a health probe keeps an idle connection open on servers with an idle deadline;
    /// None: 5 s; `Some(Duration::ZERO)`: no probes.
    pub keepalive_interval: Option<Duration>,
    /// TLS: a PEM file with the CA that signed the server's certificate (whose names must cover
    /// the host); None: plaintext.
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// An optional certificate and key this client presents (both or neither; clients need none).
    pub tls_cert_file: Option<std::path::PathBuf>,
    pub tls_key_file: Option<std::path::PathBuf>,
    /// Optional PEM revocation lists of the CA (needs `tls_ca_file`): a server whose certificate
    /// they list is refused (`Unauthenticated`). Re-read when the file changes: an open
    /// connection to a newly listed server closes.
    pub tls_crl_file: Option<std::path::PathBuf>,
}

impl ClientOptions {
    /// The defaults: plaintext, 5 s connect timeout, 5 s keepalive probes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`ClientOptions::connect_timeout`](#structfield.connect_timeout).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Sets [`ClientOptions::keepalive_interval`](#structfield.keepalive_interval)
    /// (`Duration::ZERO`: no probes).
    #[must_use]
    pub fn keepalive_interval(mut self, interval: Duration) -> Self {
        self.keepalive_interval = Some(interval);
        self
    }

    /// Sets [`ClientOptions::tls_ca_file`](#structfield.tls_ca_file): speak TLS, verifying the
    /// server against this CA.
    #[must_use]
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_ca_file = Some(path.into());
        self
    }

    /// Sets [`ClientOptions::tls_cert_file`](#structfield.tls_cert_file) (with
    /// [`ClientOptions::tls_key_file`](#method.tls_key_file)).
    #[must_use]
    pub fn tls_cert_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_cert_file = Some(path.into());
        self
    }

    /// Sets [`ClientOptions::tls_key_file`](#structfield.tls_key_file) (with
    /// [`ClientOptions::tls_cert_file`](#method.tls_cert_file)).
    #[must_use]
    pub fn tls_key_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_key_file = Some(path.into());
        self
    }

    /// Sets [`ClientOptions::tls_crl_file`](#structfield.tls_crl_file): refuse servers whose
    /// certificate the CA's lists in this file revoke.
    #[must_use]
    pub fn tls_crl_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_crl_file = Some(path.into());
        self
    }
}

/// A connection to a remote chunkserve-router or chunkserve-worker. [`Client::submit`] returns
/// the same [`Stream`] as [`Engine::submit`]. When the connection fails or the server goes away,
/// live streams end with [`FinishReason::Unavailable`] (retryable); the client reconnects by
/// itself (backoff 100 ms doubling to 5 s) and submits fail with [`Code::Unavailable`] until it
/// is back. A server with a cluster secret is answered with `$CHUNKSERVE_CLIENT_TOKEN`, else
/// `$CHUNKSERVE_CLUSTER_SECRET`; without the right key submits fail with
/// [`Code::Unauthenticated`]. Dropping it closes the connection: live
/// streams end with `Unavailable` and stay usable. `Send + Sync`: the C client handle is
/// thread-safe.
pub struct Client {
    ptr: NonNull<sys::chunkserve_client_t>,
}

// SAFETY: the C contract makes the client handle safe to use from any thread at once; only
// destroy must not overlap other calls, and Drop has exclusive access.
unsafe impl Send for Client {}
unsafe impl Sync for Client {}

fn clamp_ms(d: Duration) -> i32 {
    d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32
}

impl Client {
    /// Connects to `host:port` (the host may be a name or an IPv4/IPv6 address). Errors:
    /// `InvalidArgument` (empty host, port 0, unusable TLS files), `Unavailable` (does not
    /// resolve, refused, timed out; the message says which), `Unauthenticated` (the TLS
    /// handshake failed).
    pub fn connect(host: &str, port: u16, options: &ClientOptions) -> Result<Client> {
        // SAFETY: zeroed is a valid bit pattern for the plain C struct; init overwrites it.
        let mut o: sys::chunkserve_client_options_t = unsafe { std::mem::zeroed() };
        call(|e| unsafe {
            sys::chunkserve_client_options_init(
                &mut o,
                size_of::<sys::chunkserve_client_options_t>() as u32,
                e,
            )
        })?;
        let host = CString::new(host)
            .map_err(|_| Error::new(Code::InvalidArgument, "host contains a NUL byte"))?;
        o.host = host.as_ptr();
        o.port = i32::from(port);
        if let Some(t) = options.connect_timeout {
            o.connect_timeout_ms = clamp_ms(t).max(1);
        }
        if let Some(t) = options.keepalive_interval {
            o.keepalive_interval_ms = if t.is_zero() { -1 } else { clamp_ms(t) };
        }
        let path = |p: &Option<std::path::PathBuf>| -> Result<Option<CString>> {
            p.as_ref()
                .map(|p| {
                    let text = p.to_str().ok_or_else(|| {
                        Error::new(Code::InvalidArgument, "TLS file path is not UTF-8")
                    })?;
                    CString::new(text).map_err(|_| {
                        Error::new(Code::InvalidArgument, "TLS file path contains NUL")
                    })
                })
                .transpose()
        };
        let (ca, cert, key, crl) = (
            path(&options.tls_ca_file)?,
            path(&options.tls_cert_file)?,
            path(&options.tls_key_file)?,
            path(&options.tls_crl_file)?,
        );
        let as_ptr = |c: &Option<CString>| c.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        o.tls_ca_file = as_ptr(&ca);
        o.tls_cert_file = as_ptr(&cert);
        o.tls_key_file = as_ptr(&key);
        o.tls_crl_file = as_ptr(&crl);
        let mut raw = ptr::null_mut();
        // SAFETY: o, host and the TLS paths outlive the call; raw receives a new client on success.
        call(|e| unsafe { sys::chunkserve_client_create(&o, &mut raw, e) })?;
        let ptr = NonNull::new(raw).ok_or_else(|| Error::new(Code::Internal, "null client"))?;
        Ok(Client { ptr })
    }

    /// Sends a request; the stream yields its tokens. Checks that need the model (token ids
    /// below the vocabulary, the context) and admission happen on the server: such a rejection
    /// ends the stream with its error (e.g. `InvalidArgument`, `ResourceExhausted`).
    pub fn submit(&self, request: &Request<'_>) -> Result<Stream> {
        let r = c_request(request)?;
        let mut raw = ptr::null_mut();
        // SAFETY: the token slices outlive the call (the library copies them).
        call(|e| unsafe { sys::chunkserve_client_submit(self.ptr.as_ptr(), &r, &mut raw, e) })?;
        Stream::from_raw(raw)
    }

    /// Cancels this client's live request with that id ([`Stream::id`]); `NotFound` when none
    /// is live.
    pub fn cancel(&self, request_id: u64) -> Result<()> {
        // SAFETY: a live client handle.
        call(|e| unsafe { sys::chunkserve_client_cancel(self.ptr.as_ptr(), request_id, e) })
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // SAFETY: we own the handle and nothing else can be using it (&mut self).
        unsafe { sys::chunkserve_client_destroy(self.ptr.as_ptr()) }
    }
}

/// Facts about the served model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Info {
    pub vocab_size: i32,
    pub max_context: i32,
    pub chunk_size: i32,
    pub model_fingerprint: u64,
}

/// A generation request; zero values mean the defaults. Non-exhaustive: start from
/// [`Request::new`] with the prompt, then use the builder methods or assign fields.
///
/// ```
/// use chunkserve::Request;
/// use std::time::Duration;
/// let prompt = [1, 2, 3];
/// let request = Request::new(&prompt).max_new_tokens(32).temperature(0.7).seed(7)
///     .timeout(Duration::from_secs(5));
/// assert_eq!(request.prompt, &prompt);
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Request<'a> {
    /// Token ids in [0, vocab); required.
    pub prompt: &'a [i32],
    /// 0: 16.
    pub max_new_tokens: i32,
    /// Generating one of these ends the request ([`FinishReason::StopToken`]).
    pub stop_tokens: &'a [i32],
    /// 0: greedy.
    pub temperature: f32,
    /// 0: no limit.
    pub top_k: i32,
    /// 0: 1 (no limit).
    pub top_p: f32,
    pub seed: u64,
    /// Higher runs first and is preempted last.
    pub priority: i32,
    /// The request ends with [`FinishReason::Deadline`] after this long.
    pub timeout: Option<Duration>,
    /// `Some(k)`, k in 0..=20: every token comes with its log-probability and the k most likely
    /// tokens at its position ([`Logprobs`]).
    pub logprobs: Option<i32>,
}

impl<'a> Request<'a> {
    /// A request for `prompt` with every other field at its default.
    pub fn new(prompt: &'a [i32]) -> Self {
        Request {
            prompt,
            ..Default::default()
        }
    }

    /// Sets [`Request::timeout`](#structfield.timeout).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets [`Request::logprobs`](#structfield.logprobs): each token's log-probability and the
    /// `top` most likely alternatives (0..=20).
    #[must_use]
    pub fn logprobs(mut self, top: i32) -> Self {
        self.logprobs = Some(top);
        self
    }

    setters! {
        /// Sets [`Request::prompt`](#structfield.prompt).
        prompt: &'a [i32],
        /// Sets [`Request::max_new_tokens`](#structfield.max_new_tokens).
        max_new_tokens: i32,
        /// Sets [`Request::stop_tokens`](#structfield.stop_tokens).
        stop_tokens: &'a [i32],
        /// Sets [`Request::temperature`](#structfield.temperature).
        temperature: f32,
        /// Sets [`Request::top_k`](#structfield.top_k).
        top_k: i32,
        /// Sets [`Request::top_p`](#structfield.top_p).
        top_p: f32,
        /// Sets [`Request::seed`](#structfield.seed).
        seed: u64,
        /// Sets [`Request::priority`](#structfield.priority).
        priority: i32,
    }
}

/// Engine counters and gauges ([`Engine::stats`]); the C ABI's `chunkserve_engine_stats_t`
/// without its bookkeeping fields. Counters count since the engine was created; gauges describe
/// the last engine step. Non-exhaustive: later versions may add fields.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct EngineStats {
    /// Requests accepted by submit.
    pub requests_submitted: u64,
    /// Requests that reached their terminal event (any [`FinishReason`]).
    pub requests_finished: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Prompt tokens whose KV came from the prefix cache (not recomputed).
    pub prefix_hit_tokens: u64,
    /// Tokens run through prefill.
    pub prefill_tokens: u64,
    /// Tokens streamed out.
    pub generated_tokens: u64,
    /// Engine steps run.
    pub steps: u64,
    /// KV chunks evicted from the prefix cache to make room.
    pub evicted_chunks: u64,
    /// Sequences preempted (their KV freed, to be recomputed later) under memory pressure.
    pub preemptions: u64,
    /// Gauge: sequences in the running batch at the last step.
    pub running: i32,
    /// Gauge: requests submitted and not yet admitted.
    pub queued: i32,
    /// Gauge: sequences in the last step's batch.
    pub last_batch_size: i32,
    /// Gauge: KV bytes in use: referenced plus retained, shared chunks counted once.
    pub kv_bytes_used: u64,
    /// Gauge: KV bytes referenced by live sequences.
    pub kv_bytes_referenced: u64,
    /// Gauge: the KV bytes live sequences would use without prefix sharing.
    pub kv_bytes_if_unshared: u64,
    /// The KV cache's size in bytes.
    pub kv_bytes_capacity: u64,
    /// The maximum of `kv_bytes_referenced` so far.
    pub kv_bytes_peak: u64,
    /// Gauge: KV chunks in the cache.
    pub chunks_total: i32,
    /// Gauge: KV chunks referenced by two or more live sequences.
    pub chunks_shared: i32,
    /// Gauge: unreferenced KV chunks kept for reuse (the prefix cache).
    pub chunks_retained: i32,
    /// Decode throughput over the last few seconds, tokens per second.
    pub decode_tokens_per_s: f64,
    /// Prefill throughput over the last few seconds, tokens per second.
    pub prefill_tokens_per_s: f64,
}

impl EngineStats {
    fn from_c(s: &sys::chunkserve_engine_stats_t) -> EngineStats {
        EngineStats {
            requests_submitted: s.requests_submitted,
            requests_finished: s.requests_finished,
            prompt_tokens: s.prompt_tokens,
            prefix_hit_tokens: s.prefix_hit_tokens,
            prefill_tokens: s.prefill_tokens,
            generated_tokens: s.generated_tokens,
            steps: s.steps,
            evicted_chunks: s.evicted_chunks,
            preemptions: s.preemptions,
            running: s.running,
            queued: s.queued,
            last_batch_size: s.last_batch_size,
            kv_bytes_used: s.kv_bytes_used,
            kv_bytes_referenced: s.kv_bytes_referenced,
            kv_bytes_if_unshared: s.kv_bytes_if_unshared,
            kv_bytes_capacity: s.kv_bytes_capacity,
            kv_bytes_peak: s.kv_bytes_peak,
            chunks_total: s.chunks_total,
            chunks_shared: s.chunks_shared,
            chunks_retained: s.chunks_retained,
            decode_tokens_per_s: s.decode_tokens_per_s,
            prefill_tokens_per_s: s.prefill_tokens_per_s,
        }
    }
}

/// Why a request ended. Non-exhaustive: a `match` needs a `_` arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FinishReason {
    StopToken,
    Length,
    Cancelled,
    Deadline,
    Error,
    Unavailable,
}

impl FinishReason {
    fn from_raw(raw: i32) -> FinishReason {
        match raw {
            sys::CHUNKSERVE_FINISH_STOP_TOKEN => FinishReason::StopToken,
            sys::CHUNKSERVE_FINISH_LENGTH => FinishReason::Length,
            sys::CHUNKSERVE_FINISH_CANCELLED => FinishReason::Cancelled,
            sys::CHUNKSERVE_FINISH_DEADLINE => FinishReason::Deadline,
            sys::CHUNKSERVE_FINISH_UNAVAILABLE => FinishReason::Unavailable,
            _ => FinishReason::Error, // unknown future values count as errors
        }
    }
}

/// A request's terminal event.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finish {
    pub reason: FinishReason,
    pub prompt_tokens: i32,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: i32,
    pub generated_tokens: i32,
    /// The engine's error for `Error` and `Unavailable`.
    pub error: Option<Error>,
}

/// A generated token's log-probabilities ([`Request::logprobs`]), under the model's own
/// distribution softmax(logits), before temperature and top-k / top-p; `f32::NEG_INFINITY` for
/// a token of probability 0.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct Logprobs {
    /// Of the generated token.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(i32, f32)>,
}

/// One element of a stream. Non-exhaustive, and so is `Token`: match it as
/// `Event::Token { token, index, .. }` and give the `match` a `_` arm.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A generated token, its 0-based position among the generated tokens, and its logprobs
    /// when the request asked for them.
    #[non_exhaustive]
    Token {
        token: i32,
        index: i32,
        logprobs: Option<Logprobs>,
    },
    /// The terminal event.
    Finished(Finish),
}

/// # Safety
/// `e.error_message` must be null or a valid C string.
unsafe fn event_from_c(e: &sys::chunkserve_stream_event_t) -> Event {
    if e.kind == sys::CHUNKSERVE_EVENT_TOKEN {
        // A library older than 0.4 writes a version 1 event, without the logprobs fields.
        let v2 = e.struct_size as usize >= size_of::<sys::chunkserve_stream_event_t>();
        let n = if v2 {
            e.num_top_logprobs.clamp(-1, e.top_tokens.len() as i32)
        } else {
            -1
        };
        let logprobs = (n >= 0).then(|| Logprobs {
            logprob: e.logprob,
            top: (0..n as usize)
                .map(|i| (e.top_tokens[i], e.top_logprobs[i]))
                .collect(),
        });
        return Event::Token {
            token: e.token,
            index: e.index,
            logprobs,
        };
    }
    let error = (e.status != sys::CHUNKSERVE_STATUS_OK).then(|| {
        let message = if e.error_message.is_null() {
            String::new()
        } else {
            CStr::from_ptr(e.error_message)
                .to_string_lossy()
                .into_owned()
        };
        Error {
            code: Code::from_raw(e.status),
            message,
        }
    });
    Event::Finished(Finish {
        reason: FinishReason::from_raw(e.finish_reason),
        prompt_tokens: e.prompt_tokens,
        cached_tokens: e.cached_tokens,
        generated_tokens: e.generated_tokens,
        error,
    })
}

type Callback = Box<dyn FnMut(Event) + Send + 'static>;

/// One request's output: tokens, then one terminal event. As an [`Iterator`] it yields the
/// tokens (`Ok(token)`), then ends; when the request failed (`Error` or `Unavailable`) it yields
/// that error once before ending. [`Stream::finish`] then holds the terminal event. Dropping the
/// stream cancels a request that is still running.
pub struct Stream {
    ptr: NonNull<sys::chunkserve_stream_t>,
    finish: Option<Finish>,
    ended: bool,
    // Freed after chunkserve_stream_destroy, which guarantees no invocation is running or follows.
    callback: Option<Box<Callback>>,
}

// SAFETY: the C stream handle may be used from any thread; its &self methods (id, cancel) may
// overlap each other and next, and the &mut self methods cannot overlap anything in safe Rust.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    fn from_raw(raw: *mut sys::chunkserve_stream_t) -> Result<Stream> {
        let ptr = NonNull::new(raw).ok_or_else(|| Error::new(Code::Internal, "null stream"))?;
        Ok(Stream {
            ptr,
            finish: None,
            ended: false,
            callback: None,
        })
    }

    /// The request id, for [`Engine::cancel`] (or [`Client::cancel`]).
    pub fn id(&self) -> u64 {
        // SAFETY: a live stream handle.
        unsafe { sys::chunkserve_stream_id(self.ptr.as_ptr()) }
    }

    /// Asks the engine to cancel; the terminal event ([`FinishReason::Cancelled`]) still comes.
    /// A no-op once the request has finished.
    pub fn cancel(&self) -> Result<()> {
        // SAFETY: a live stream handle.
        call(|e| unsafe { sys::chunkserve_stream_cancel(self.ptr.as_ptr(), e) })
    }

    /// The terminal event, once it has been received.
    pub fn finish(&self) -> Option<&Finish> {
        self.finish.as_ref()
    }

    /// Waits up to `timeout` (None: no limit) for the next event. `Ok(None)` once the terminal
    /// event has been returned; `Err` with [`Code::DeadlineExceeded`] when the timeout passed.
    pub fn next_event(&mut self, timeout: Option<Duration>) -> Result<Option<Event>> {
        let timeout_ms = match timeout {
            None => sys::CHUNKSERVE_WAIT_FOREVER,
            Some(t) => t.as_millis().min(i64::MAX as u128) as i64,
        };
        // SAFETY: zeroed is valid for the plain C struct.
        let mut ev: sys::chunkserve_stream_event_t = unsafe { std::mem::zeroed() };
        ev.struct_size = size_of::<sys::chunkserve_stream_event_t>() as u32;
        let mut error = ptr::null_mut();
        // SAFETY: a live stream handle and a correctly sized event.
        let status = unsafe {
            sys::chunkserve_stream_next(self.ptr.as_ptr(), timeout_ms, &mut ev, &mut error)
        };
        if status == sys::CHUNKSERVE_STATUS_OUT_OF_RANGE {
            check(sys::CHUNKSERVE_STATUS_OK, error)?; // frees the error object
            self.ended = true;
            return Ok(None);
        }
        check(status, error)?;
        // SAFETY: error_message is valid until the stream is destroyed.
        let event = unsafe { event_from_c(&ev) };
        if let Event::Finished(f) = &event {
            self.finish = Some(f.clone());
        }
        Ok(Some(event))
    }

    /// Receives the remaining events and returns the terminal one (tokens are discarded).
    pub fn wait(&mut self) -> Result<Finish> {
        while self.next_event(None)?.is_some() {}
        self.finish
            .clone()
            .ok_or_else(|| Error::new(Code::Internal, "stream ended without a terminal event"))
    }

    /// Delivers every event to `f` instead of the pull API, in order, starting with the events
    /// already queued (delivered on this thread before this returns). Later events arrive on the
    /// engine's thread: `f` must be quick and must not block. A panic in `f` is caught (and the
    /// rest of the events are dropped). Afterwards the pull API returns `FailedPrecondition`.
    pub fn set_callback(&mut self, f: impl FnMut(Event) + Send + 'static) -> Result<()> {
        if self.callback.is_some() {
            return Err(Error::new(Code::FailedPrecondition, "callback already set"));
        }
        let mut boxed: Box<Callback> = Box::new(Box::new(f));
        let user_data = (&mut *boxed) as *mut Callback as *mut c_void;
        // SAFETY: user_data points into a heap box kept alive until after chunkserve_stream_destroy.
        let result = call(|e| unsafe {
            sys::chunkserve_stream_set_callback(self.ptr.as_ptr(), Some(trampoline), user_data, e)
        });
        // Keep the box even on failure: the library never invokes a callback it rejected, and
        // dropping it at destroy time is always safe.
        self.callback = Some(boxed);
        result
    }
}

unsafe extern "C" fn trampoline(
    event: *const sys::chunkserve_stream_event_t,
    user_data: *mut c_void,
) {
    let callback = &mut *(user_data as *mut Callback);
    let event = event_from_c(&*event);
    // Unwinding into C is undefined behaviour: stop it here.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(event)));
}

impl Iterator for Stream {
    type Item = Result<i32>;

    fn next(&mut self) -> Option<Result<i32>> {
        if self.ended {
            return None;
        }
        match self.next_event(None) {
            Ok(Some(Event::Token { token, .. })) => Some(Ok(token)),
            Ok(Some(Event::Finished(f))) => {
                self.ended = true;
                f.error.map(Err)
            }
            Ok(None) => {
                self.ended = true;
                None
            }
            Err(e) => {
                self.ended = true;
                Some(Err(e))
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: we own the handle; &mut self excludes concurrent calls. After destroy returns
        // the callback is never invoked again, so its box can go.
        unsafe { sys::chunkserve_stream_destroy(self.ptr.as_ptr()) }
        self.callback.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every EngineStats field comes from the C field of the same name (distinct values catch a
    /// swapped or dropped field).
    #[test]
    fn engine_stats_fields_map_one_to_one() {
        // SAFETY: zeroed is valid for the plain C struct.
        let mut c: sys::chunkserve_engine_stats_t = unsafe { std::mem::zeroed() };
        c.struct_size = size_of::<sys::chunkserve_engine_stats_t>() as u32;
        c.running = 1;
        c.requests_submitted = 2;
        c.requests_finished = 3;
        c.prompt_tokens = 4;
        c.prefix_hit_tokens = 5;
        c.prefill_tokens = 6;
        c.generated_tokens = 7;
        c.steps = 8;
        c.evicted_chunks = 9;
        c.preemptions = 10;
        c.queued = 11;
        c.last_batch_size = 12;
        c.kv_bytes_used = 13;
        c.kv_bytes_referenced = 14;
        c.kv_bytes_if_unshared = 15;
        c.kv_bytes_capacity = 16;
        c.kv_bytes_peak = 17;
        c.chunks_total = 18;
        c.chunks_shared = 19;
        c.chunks_retained = 20;
        c.reserved0 = 99;
        c.decode_tokens_per_s = 21.5;
        c.prefill_tokens_per_s = 22.5;
        let s = EngineStats::from_c(&c);
        let want = EngineStats {
            running: 1,
            requests_submitted: 2,
            requests_finished: 3,
            prompt_tokens: 4,
            prefix_hit_tokens: 5,
            prefill_tokens: 6,
            generated_tokens: 7,
            steps: 8,
            evicted_chunks: 9,
            preemptions: 10,
            queued: 11,
            last_batch_size: 12,
            kv_bytes_used: 13,
            kv_bytes_referenced: 14,
            kv_bytes_if_unshared: 15,
            kv_bytes_capacity: 16,
            kv_bytes_peak: 17,
            chunks_total: 18,
            chunks_shared: 19,
            chunks_retained: 20,
            decode_tokens_per_s: 21.5,
            prefill_tokens_per_s: 22.5,
        };
        assert_eq!(s, want);
    }

    #[test]
    fn builders_set_the_fields_they_name() {
        let o = EngineOptions::new()
            .model_path("/m")
            .backend(Backend::Cuda)
            .kv_cache_bytes(1)
            .chunk_size(2)
            .kv_dtype(DType::BF16)
            .gguf_dtype(DType::F16)
            .prefix_sharing(false)
            .num_threads(3)
            .max_batch_size(4)
            .prefill_token_budget(5)
            .max_queued_requests(6);
        assert_eq!(o.model_path.as_deref(), Some(std::path::Path::new("/m")));
        assert_eq!(
            (o.backend, o.kv_dtype, o.gguf_dtype, o.prefix_sharing),
            (Backend::Cuda, DType::BF16, DType::F16, false)
        );
        assert_eq!(
            (
                o.kv_cache_bytes,
                o.chunk_size,
                o.num_threads,
                o.max_batch_size
            ),
            (1, 2, 3, 4)
        );
        assert_eq!((o.prefill_token_budget, o.max_queued_requests), (5, 6));
        assert!(
            EngineOptions::new().prefix_sharing,
            "prefix sharing is on by default"
        );

        let (p, stop) = ([1, 2], [3]);
        let r = Request::new(&p)
            .max_new_tokens(7)
            .stop_tokens(&stop)
            .temperature(0.5)
            .top_k(8)
            .top_p(0.9)
            .seed(9)
            .priority(-1)
            .timeout(Duration::from_millis(10));
        assert_eq!((r.prompt, r.stop_tokens), (&p[..], &stop[..]));
        assert_eq!(
            (r.max_new_tokens, r.top_k, r.seed, r.priority),
            (7, 8, 9, -1)
        );
        assert_eq!((r.temperature, r.top_p), (0.5, 0.9));
        assert_eq!(r.timeout, Some(Duration::from_millis(10)));
        assert_eq!(Request::default().prompt(&p).prompt, &p[..]);

        let c = ClientOptions::new()
            .connect_timeout(Duration::from_secs(1))
            .keepalive_interval(Duration::ZERO)
            .tls_ca_file("ca.pem")
            .tls_cert_file("node.pem")
            .tls_key_file("node.key");
        assert_eq!(c.connect_timeout, Some(Duration::from_secs(1)));
        assert_eq!(c.keepalive_interval, Some(Duration::ZERO));
        assert_eq!(c.tls_ca_file, Some(PathBuf::from("ca.pem")));
        assert_eq!(c.tls_cert_file, Some(PathBuf::from("node.pem")));
        assert_eq!(c.tls_key_file, Some(PathBuf::from("node.key")));
    }
}
