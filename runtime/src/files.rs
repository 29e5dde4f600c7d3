//! Private files: where kiln writes code it will run or read back, and how it replaces a file.
//!
//! A file written under a name another local user can predict, in a folder they can write, can
//! be planted (a link, or a file of theirs) or swapped between the write and the read: kiln
//! would then load their code or ship it in an artifact. So every temporary file (the runtime's
//! kernel library, the compiler's link and disassembly files) lies in a [`PrivateDir`]: a fresh
//! directory of the temporary folder, named from the OS's randomness, that kiln created itself
//! with mode 0700 (a directory that already exists is never reused). Final files are written
//! aside under an unpredictable name, created exclusively, then renamed over the destination
//! ([`replace`], [`replace_private`]), so a reader sees the old file or the new one whole.
//!
//! kiln's own folders that last (the compile cache) are checked before they are trusted
//! ([`private_folder`], [`open_owned`]): they must belong to this user and no one else may write
//! them. The ownership checks exist on Unix only; elsewhere they pass.
//!
//! The runtime never links MLIR and the compiler depends on the runtime, so both use this module.

use std::fs::{File, Metadata};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// How many fresh names [`PrivateDir`] and the writers try before giving up: a name exists
/// already only if someone guessed 64 random bits, or planted many.
const TRIES: usize = 8;

/// A directory of the temporary folder that this process created, that only this user may
/// enter (0700), under a name no other process can predict; removed with its contents on drop.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
    /// False once [`PrivateDir::keep`] was called: the directory outlives the value.
    remove: bool,
}

impl PrivateDir {
    /// A fresh directory `<prefix>-<pid>-<random>` in the temporary folder.
    pub fn new(prefix: &str) -> io::Result<PrivateDir> {
        PrivateDir::new_in(&std::env::temp_dir(), prefix)
    }

    /// A fresh directory `<prefix>-<pid>-<random>` in `base`.
    pub fn new_in(base: &Path, prefix: &str) -> io::Result<PrivateDir> {
        for _ in 0..TRIES {
            let path =
                base.join(format!("{prefix}-{}-{:016x}", std::process::id(), unpredictable()));
            // `create`, never `create_dir_all`: a directory that exists is someone else's.
            match private_builder().create(&path) {
                Ok(()) => return Ok(PrivateDir { path, remove: true }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("cannot create a private directory in {}: {e}", base.display()),
                    ))
                }
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "cannot create a private directory in {} (every name tried exists)",
                base.display()
            ),
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path in the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Leaves the directory and its files in place (for a profiler or a person to read); returns
    /// its path.
    pub fn keep(mut self) -> PathBuf {
        self.remove = false;
        self.path.clone()
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        if self.remove {
            // Nothing to do about a failure: the directory is private, and the temporary folder
            // is cleaned by the system.
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A `DirBuilder` that makes directories only this user may enter.
fn private_builder() -> std::fs::DirBuilder {
    #[allow(unused_mut)] // Only Unix sets a mode.
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder
}

/// 64 bits no other process can guess: the OS's randomness, else std's per-process random
/// hasher keys mixed with the time.
pub fn unpredictable() -> u64 {
    let mut b = [0u8; 8];
    if File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_ok() {
        return u64::from_le_bytes(b);
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Creates `path` with `mode` (less the umask; Unix only), failing if anything is there: never
/// writes through a file or link someone left at the name.
pub fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    options.open(path)
}

/// Writes a file that must not exist yet, with `mode` (see [`create_new`]).
pub fn write_new(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    create_new(path, mode)?.write_all(bytes)
}

/// Replaces `dest` with the concatenated `parts`, readable as a new file of the user's would be
/// (0666 less the umask), synced to disk before the rename: for a user's output (`kiln compile
/// -o`).
pub fn replace(dest: &Path, parts: &[&[u8]]) -> io::Result<()> {
    replace_with(dest, parts, 0o666, true)
}

/// Replaces `dest` with the concatenated `parts`, that only this user may read or write (0600),
/// not synced: for kiln's own caches, where a file lost to a crash costs only time.
pub fn replace_private(dest: &Path, parts: &[&[u8]]) -> io::Result<()> {
    replace_with(dest, parts, 0o600, false)
}

/// Writes `parts` to a sibling of `dest` named `.<name>.<random>.tmp`, created exclusively, then
/// renames it over `dest`: a reader sees the old file or the new one, never a part, and no one
/// can plant the temporary file.
fn replace_with(dest: &Path, parts: &[&[u8]], mode: u32, sync: bool) -> io::Result<()> {
    let name = dest.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{} names no file", dest.display()))
    })?;
    let folder = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    for _ in 0..TRIES {
        let tmp = folder.join(format!(".{}.{:016x}.tmp", name.to_string_lossy(), unpredictable()));
        let file = match create_new(&tmp, mode) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(at(&tmp, e)),
        };
        let written = fill(file, parts, sync).and_then(|()| std::fs::rename(&tmp, dest));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(at(&tmp, e));
        }
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("cannot create a temporary file in {} (every name tried exists)", folder.display()),
    ))
}

fn fill(mut file: File, parts: &[&[u8]], sync: bool) -> io::Result<()> {
    for part in parts {
        file.write_all(part)?;
    }
    if sync {
        file.sync_all()?;
    }
    Ok(())
}

/// The error, with the path it concerns.
fn at(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Makes `dir` (and any missing parents, all mode 0700) if it is not there, and checks that it
/// can be trusted: a directory of this user's (following a link the user made) that no one else
/// may write. One this user owns that others may read or write is tightened to 0700 first.
/// An error says why it is refused; nothing in a refused folder should be read or written.
pub fn private_folder(dir: &Path) -> io::Result<()> {
    private_builder().recursive(true).create(dir).map_err(|e| at(dir, e))?;
    let meta = std::fs::metadata(dir).map_err(|e| at(dir, e))?;
    if !meta.is_dir() {
        return Err(refused(dir, "is not a directory"));
    }
    // Tightened before the check: a folder an older kiln made under a umask of 002 is 0775,
    // and what others may have put in it while it was open is refused file by file
    // ([`open_owned`]). Where it cannot be tightened (a read-only file system), the check
    // decides.
    tighten(dir, &meta);
    check_owner(&std::fs::metadata(dir).map_err(|e| at(dir, e))?, dir)
}

/// A folder of this user's that others may enter becomes 0700 (caches made before kiln made
/// them private were 0755). Another user's is left alone (and then refused).
#[cfg(unix)]
fn tighten(dir: &Path, meta: &Metadata) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if meta.uid() == effective_uid() && meta.mode() & 0o077 != 0 {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    }
}

#[cfg(not(unix))]
fn tighten(_: &Path, _: &Metadata) {}

/// Opens a file to read only if it can be trusted: a plain file (not a link: the name is opened
/// without following one), this user's, that no one else may write. The checks are on the file
/// opened, so it cannot be swapped between them and the read.
pub fn open_owned(path: &Path) -> io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW);
    }
    let file = options.open(path).map_err(|e| opening(path, e))?;
    let meta = file.metadata().map_err(|e| at(path, e))?;
    if !meta.is_file() {
        return Err(refused(path, "is not a plain file"));
    }
    check_owner(&meta, path)?;
    Ok(file)
}

/// The error of opening `path` without following a link, saying so when it was one.
fn opening(path: &Path, e: io::Error) -> io::Error {
    #[cfg(unix)]
    if e.raw_os_error() == Some(libc::ELOOP) {
        return refused(path, "is a symbolic link (not followed)");
    }
    at(path, e)
}

/// Refuses what another user owns or what others may write (Unix: anyone but its owner, and
/// root, who can do anything anyway).
#[cfg(unix)]
pub fn check_owner(meta: &Metadata, path: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let me = effective_uid();
    if meta.uid() != me {
        return Err(refused(
            path,
            &format!("belongs to user {}, not to this user ({me})", meta.uid()),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(refused(
            path,
            &format!("can be written by other users (mode {:o})", meta.mode() & 0o777),
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
pub fn check_owner(_: &Metadata, _: &Path) -> io::Result<()> {
    Ok(())
}

/// The user this process acts as.
#[cfg(unix)]
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions, touches no memory of ours and cannot fail.
    unsafe { libc::geteuid() }
}

fn refused(path: &Path, why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, format!("{} {why}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
        }
        #[cfg(not(unix))]
        0
    }

    #[test]
    #[cfg(unix)]
    fn a_private_directory_is_fresh_0700_and_removed_with_its_files() {
        let dir = PrivateDir::new("kiln-test").unwrap();
        let dir2 = PrivateDir::new("kiln-test").unwrap();
        assert_ne!(dir.path(), dir2.path(), "every call gets a directory of its own");
        assert_eq!(mode(dir.path()), 0o700);
        let path = dir.join("kernels.so");
        write_new(&path, b"code", 0o700).unwrap();
        // A file (or a link someone planted) already at the path is never written through.
        assert_eq!(
            write_new(&path, b"other", 0o700).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"code");
        let (p, p2) = (dir.path().to_path_buf(), dir2.path().to_path_buf());
        drop(dir);
        drop(dir2);
        assert!(!p.exists() && !p2.exists(), "dropped directories are removed");
    }

    #[test]
    fn a_kept_directory_stays() {
        let path = PrivateDir::new("kiln-test").unwrap().keep();
        assert!(path.is_dir());
        std::fs::remove_dir(&path).unwrap();
    }

    #[test]
    #[cfg(unix)]
    fn replacing_a_file_writes_it_whole_and_leaves_no_temporary() {
        let dir = PrivateDir::new("kiln-test").unwrap();
        let dest = dir.join("out.kiln");
        std::fs::write(&dest, b"old").unwrap();
        replace_private(&dest, &[b"ne", b"w"]).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"new");
        assert_eq!(mode(&dest), 0o600);
        replace(&dest, &[b"newer"]).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"newer");
        let names: Vec<_> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["out.kiln"]);
        // A destination in a folder that is not there is an error naming the temporary file.
        let e = replace(&dir.join("no/such/out.kiln"), &[b"x"]).unwrap_err();
        assert!(e.to_string().contains("out.kiln"), "{e}");
    }

    #[test]
    #[cfg(unix)]
    fn a_private_folder_is_made_0700_and_an_open_one_of_ours_is_tightened() {
        use std::os::unix::fs::PermissionsExt;
        let base = PrivateDir::new("kiln-test").unwrap();
        let dir = base.join("a/b");
        private_folder(&dir).unwrap();
        assert_eq!((mode(&base.join("a")), mode(&dir)), (0o700, 0o700));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        private_folder(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        // A file where the folder should be is refused.
        let file = base.join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(private_folder(&file).is_err());
        // A folder another user made first, even one only they may write, is refused and left
        // as it is (root can give one away; skipped otherwise).
        if effective_uid() == 0 {
            let theirs = base.join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
            let e = private_folder(&theirs).unwrap_err();
            assert!(e.to_string().contains("belongs to user 65534"), "{e}");
            assert_eq!(mode(&theirs), 0o755, "another user's folder is not changed");
        } else {
            eprintln!("SKIPPED: another user's folder is refused (needs root to give one away)");
        }
    }

    #[test]
    #[cfg(unix)]
    fn only_our_own_plain_files_that_others_cannot_write_are_opened() {
        use std::os::unix::fs::PermissionsExt;
        let dir = PrivateDir::new("kiln-test").unwrap();
        let ours = dir.join("ours");
        write_new(&ours, b"x", 0o600).unwrap();
        assert!(open_owned(&ours).is_ok());
        std::fs::set_permissions(&ours, std::fs::Permissions::from_mode(0o622)).unwrap();
        let e = open_owned(&ours).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("written by other users"), "{e}");
        // A link is not followed, even to a file that would pass.
        let good = dir.join("good");
        write_new(&good, b"x", 0o600).unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let e = open_owned(&link).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        // What is not there is `NotFound`, for a cache's miss.
        assert_eq!(open_owned(&dir.join("none")).unwrap_err().kind(), io::ErrorKind::NotFound);
        // Another user's file (root can give one away; skipped otherwise).
        if effective_uid() == 0 {
            std::os::unix::fs::chown(&good, Some(65534), None).unwrap();
            let e = open_owned(&good).unwrap_err();
            assert!(e.to_string().contains("belongs to user 65534"), "{e}");
        } else {
            eprintln!("SKIPPED: another user's file is refused (needs root to give one away)");
        }
    }
}
