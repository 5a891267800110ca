//! Finds and links libchunkserve.so, in this order:
//!
//!  1. `CHUNKSERVE_LIB_DIR`: the directory that holds libchunkserve.so (a build tree's lib/ or an
//!     install prefix's lib); it must be absolute and hold the library;
//!  2. `pkg-config --libs --cflags chunkserve` (the binary named by `PKG_CONFIG`, else
//!     `pkg-config`; `PKG_CONFIG_PATH` and the rest of pkg-config's environment apply): its output
//!     is parsed here, without crates: `-L` (link path and rpath), `-l` (libraries),
//!     `-Wl,-rpath,DIR` / `-Wl,-rpath=DIR` / `-Wl,-R,DIR` (rpaths), other `-Wl,` flags (passed on
//!     to the linker), `-I` (exported as `DEP_CHUNKSERVE_INCLUDE`); `-D` and `-pthread` are ignored;
//!  3. otherwise the build fails with a message that says how to fix it (instead of the linker's
//!     "unable to find library -lchunkserve").
//!
//! The library directories are recorded as rpaths for this crate's tests and exported to
//! dependents (Cargo passes link-arg only to the package's own targets) as `DEP_CHUNKSERVE_RPATH`
//! (colon-separated) and `DEP_CHUNKSERVE_LIB_DIR` (the first library directory).
use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{self, Command};

/// What to link, from either source.
#[derive(Default)]
struct Link {
    search: Vec<PathBuf>,
    libs: Vec<String>,
    rpaths: Vec<PathBuf>,
    link_args: Vec<String>,
    include: Vec<PathBuf>,
}

fn main() {
    let lib_dir = env::var_os("CHUNKSERVE_LIB_DIR").filter(|d| !d.is_empty());
    let link = match lib_dir {
        Some(dir) => from_lib_dir(PathBuf::from(dir)),
        None => match from_pkg_config() {
            Ok(link) => link,
            Err(why) => fail(&not_found_message(&why)),
        },
    };
    // Only on success: a build script that failed runs again anyway, and its output stays short.
    for var in [
        "CHUNKSERVE_LIB_DIR",
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    emit(&link);
}

fn from_lib_dir(dir: PathBuf) -> Link {
    if !dir.is_absolute() {
        fail(&format!(
            "CHUNKSERVE_LIB_DIR={} is a relative path; set it to an absolute path (build scripts \
             run in the crate's directory, not where cargo was started), e.g. \
             CHUNKSERVE_LIB_DIR={}",
            dir.display(),
            example_lib_dir().display()
        ));
    }
    if !has_library(&dir) {
        fail(&format!(
            "CHUNKSERVE_LIB_DIR={} does not contain libchunkserve.so; set it to the directory \
             that does (a build tree's lib/, e.g. {}, or an install prefix's lib/) after building \
             the library (target chunkserve_capi)",
            dir.display(),
            example_lib_dir().display()
        ));
    }
    Link {
        search: vec![dir.clone()],
        libs: vec!["dylib=chunkserve".to_string()],
        rpaths: vec![dir],
        ..Link::default()
    }
}

fn has_library(dir: &Path) -> bool {
    ["libchunkserve.so", "libchunkserve.dylib"]
        .iter()
        .any(|name| dir.join(name).exists())
}

/// Runs pkg-config; Err holds why it did not give a usable answer.
fn from_pkg_config() -> Result<Link, String> {
    let program = env::var_os("PKG_CONFIG").unwrap_or_else(|| OsString::from("pkg-config"));
    let shown = Path::new(&program).display().to_string();
    let output = Command::new(&program)
        .args(["--libs", "--cflags", "chunkserve"])
        .output()
        .map_err(|e| format!("`{shown} --libs --cflags chunkserve` could not be run: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stderr = stderr.trim().replace('\n', "\n       ");
        return Err(format!(
            "`{shown} --libs --cflags chunkserve` failed ({}):\n       {stderr}",
            output.status,
        ));
    }
    let stdout = String::from_utf8(output.stdout)
        .map_err(|_| format!("`{shown} --libs --cflags chunkserve` printed non-UTF-8 output"))?;
    let link = parse_pkg_config(&stdout)?;
    if !link.libs.iter().any(|l| l == "dylib=chunkserve") {
        return Err(format!(
            "`{shown} --libs --cflags chunkserve` printed no -lchunkserve: {:?}",
            stdout.trim()
        ));
    }
    if !link.search.is_empty() && !link.search.iter().any(|d| has_library(d)) {
        return Err(format!(
            "`{shown} --libs --cflags chunkserve` printed {:?}, but no -L directory holds \
             libchunkserve.so (a stale or uninstalled chunkserve.pc?)",
            stdout.trim()
        ));
    }
    Ok(link)
}

/// Splits pkg-config output into words: whitespace separates, a backslash escapes the next
/// character (pkg-config's quoting of paths with spaces), quotes group.
fn split_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (q, '\\') if q != Some('\'') => {
                if let Some(next) = chars.next() {
                    word.push(next);
                }
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (_, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

fn parse_pkg_config(text: &str) -> Result<Link, String> {
    let mut link = Link::default();
    let mut words = split_words(text).into_iter();
    // Set when a -Wl word ended with -rpath / -R, whose value is in the next -Wl word.
    let mut rpath_pending = false;
    while let Some(word) = words.next() {
        // "-L dir" and "-l name" may come as two words.
        let mut value = |flag: &str| -> Result<String, String> {
            match &word[flag.len()..] {
                "" => words
                    .next()
                    .ok_or_else(|| format!("{flag} without a value")),
                v => Ok(v.to_string()),
            }
        };
        if word.starts_with("-L") {
            link.search.push(PathBuf::from(value("-L")?));
        } else if word.starts_with("-l") {
            let name = value("-l")?;
            let lib = match name.strip_prefix(':') {
                Some(file) => format!("dylib:+verbatim={file}"),
                None => format!("dylib={name}"),
            };
            link.libs.push(lib);
        } else if word.starts_with("-I") {
            link.include.push(PathBuf::from(value("-I")?));
        } else if let Some(args) = word.strip_prefix("-Wl,") {
            let mut rest = Vec::new();
            for arg in args.split(',') {
                if std::mem::take(&mut rpath_pending) {
                    link.rpaths.push(PathBuf::from(arg));
                } else if let Some(dir) = ["-rpath=", "--rpath=", "-R"]
                    .iter()
                    .find_map(|p| arg.strip_prefix(p).filter(|d| !d.is_empty()))
                {
                    link.rpaths.push(PathBuf::from(dir));
                } else if matches!(arg, "-rpath" | "--rpath" | "-R") {
                    rpath_pending = true;
                } else {
                    rest.push(arg);
                }
            }
            if !rest.is_empty() {
                link.link_args.push(format!("-Wl,{}", rest.join(",")));
            }
        } else if word.starts_with("-D") || word == "-pthread" {
            // Compiler flags: nothing to do for Rust.
        } else if word.starts_with('-') {
            println!("cargo:warning=chunkserve-sys: ignoring pkg-config flag {word:?}");
        } else {
            // A library given by path.
            link.link_args.push(word);
        }
    }
    if rpath_pending {
        return Err("pkg-config output ends with -Wl,-rpath without a directory".to_string());
    }
    // Without an rpath in the .pc file, the -L directories serve (pkg-config leaves out the
    // system directories, which need none).
    if link.rpaths.is_empty() {
        link.rpaths = link.search.clone();
    }
    Ok(link)
}

fn emit(link: &Link) {
    for dir in &link.search {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    for lib in &link.libs {
        println!("cargo:rustc-link-lib={lib}");
    }
    for dir in &link.rpaths {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    for arg in &link.link_args {
        println!("cargo:rustc-link-arg={arg}");
    }
    if let Some(dir) = link.search.first() {
        println!("cargo:lib_dir={}", dir.display());
    }
    if !link.rpaths.is_empty() {
        let joined = env::join_paths(&link.rpaths).unwrap_or_else(|e| {
            fail(&format!(
                "a library directory cannot be used as an rpath: {e}"
            ))
        });
        println!("cargo:rpath={}", Path::new(&joined).display());
    }
    if let Some(dir) = link.include.first() {
        println!("cargo:include={}", dir.display());
    }
}

/// The checkout's build trees (`build*/lib`) that hold the library, else `<checkout>/build/lib`.
fn build_tree_lib_dirs() -> (Vec<PathBuf>, PathBuf) {
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..");
    let checkout = checkout.canonicalize().unwrap_or(checkout);
    let mut found: Vec<PathBuf> = std::fs::read_dir(&checkout)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("build"))
        .map(|e| e.path().join("lib"))
        .filter(|d| has_library(d))
        .collect();
    found.sort();
    (found, checkout.join("build").join("lib"))
}

fn example_lib_dir() -> PathBuf {
    let (found, default) = build_tree_lib_dirs();
    found.into_iter().next().unwrap_or(default)
}

fn not_found_message(pkg_config_error: &str) -> String {
    let (found, default) = build_tree_lib_dirs();
    let example = found.first().unwrap_or(&default);
    let built = if found.is_empty() {
        format!(
            "(no build tree of this checkout holds it yet: build the library first, e.g. \
             `cmake -B build && cmake --build build --target chunkserve_capi`, which writes \
             {})",
            default.join("libchunkserve.so").display()
        )
    } else {
        let list: Vec<String> = found
            .iter()
            .map(|d| d.join("libchunkserve.so").display().to_string())
            .collect();
        format!("(this checkout has: {})", list.join(", "))
    };
    let pkg_config_path = match env::var_os("PKG_CONFIG_PATH") {
        Some(p) => format!("PKG_CONFIG_PATH={}", Path::new(&p).display()),
        None => "PKG_CONFIG_PATH not set".to_string(),
    };
    format!(
        "chunkserve-sys cannot find libchunkserve.so (the chunkserve C library).\n\
         \n\
         Looked at:\n\
         \x20 1. CHUNKSERVE_LIB_DIR: not set\n\
         \x20 2. pkg-config ({pkg_config_path}): {pkg_config_error}\n\
         \n\
         Fix it in one of these ways:\n\
         \x20 - set CHUNKSERVE_LIB_DIR to the directory that holds libchunkserve.so, e.g. a build \
         tree's lib dir {built}:\n\
         \x20     CHUNKSERVE_LIB_DIR={example} cargo test\n\
         \x20 - install the library (`cmake --install build --prefix /usr/local`), which puts \
         chunkserve.pc where pkg-config looks by default;\n\
         \x20 - for an install under another prefix, set PKG_CONFIG_PATH to its pkgconfig \
         directory:\n\
         \x20     PKG_CONFIG_PATH=<prefix>/lib/pkgconfig cargo test   (or <prefix>/lib64/pkgconfig)\n\
         \n\
         (ctest sets CHUNKSERVE_LIB_DIR itself; the build tree's capi/chunkserve.pc describes the \
         installed layout and does not work from the build tree.)",
        example = example.display(),
    )
}

/// Prints `message` for Cargo's "--- stderr" section and fails the build script.
fn fail(message: &str) -> ! {
    eprintln!("\nerror: {message}\n");
    process::exit(1);
}
