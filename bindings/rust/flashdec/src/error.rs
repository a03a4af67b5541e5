//! Status codes and the error type.
use flashdec_sys as sys;
use std::ffi::CStr;
use std::fmt;

/// A failing `fd_status` (FD_OK is never an error).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    InvalidArgument,
    OutOfBlocks,
    NotFound,
    InvalidState,
    StaleHandle,
    Unsupported,
    NoDevice,
    Device,
    OutOfMemory,
    Internal,
    AlreadyExists,
    Invariant,
    /// A code newer than this binding.
    Other(i32),
}

impl Status {
    pub fn from_raw(raw: sys::fd_status) -> Status {
        match raw {
            sys::FD_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::FD_ERR_OUT_OF_BLOCKS => Status::OutOfBlocks,
            sys::FD_ERR_NOT_FOUND => Status::NotFound,
            sys::FD_ERR_INVALID_STATE => Status::InvalidState,
            sys::FD_ERR_STALE_HANDLE => Status::StaleHandle,
            sys::FD_ERR_UNSUPPORTED => Status::Unsupported,
            sys::FD_ERR_NO_DEVICE => Status::NoDevice,
            sys::FD_ERR_DEVICE => Status::Device,
            sys::FD_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::FD_ERR_INTERNAL => Status::Internal,
            sys::FD_ERR_ALREADY_EXISTS => Status::AlreadyExists,
            sys::FD_ERR_INVARIANT => Status::Invariant,
            other => Status::Other(other),
        }
    }

    pub fn raw(self) -> sys::fd_status {
        match self {
            Status::InvalidArgument => sys::FD_ERR_INVALID_ARGUMENT,
            Status::OutOfBlocks => sys::FD_ERR_OUT_OF_BLOCKS,
            Status::NotFound => sys::FD_ERR_NOT_FOUND,
            Status::InvalidState => sys::FD_ERR_INVALID_STATE,
            Status::StaleHandle => sys::FD_ERR_STALE_HANDLE,
            Status::Unsupported => sys::FD_ERR_UNSUPPORTED,
            Status::NoDevice => sys::FD_ERR_NO_DEVICE,
            Status::Device => sys::FD_ERR_DEVICE,
            Status::OutOfMemory => sys::FD_ERR_OUT_OF_MEMORY,
            Status::Internal => sys::FD_ERR_INTERNAL,
            Status::AlreadyExists => sys::FD_ERR_ALREADY_EXISTS,
            Status::Invariant => sys::FD_ERR_INVARIANT,
            Status::Other(raw) => raw,
        }
    }

    /// The library's static name, e.g. "FD_ERR_NOT_FOUND: not found".
    pub fn name(self) -> &'static str {
        status_string(self.raw())
    }
}

/// `fd_status_string` for any raw value (FD_OK included).
pub fn status_string(raw: sys::fd_status) -> &'static str {
    // SAFETY: the library returns a static, NUL-terminated string, never NULL.
    unsafe { CStr::from_ptr(sys::fd_status_string(raw)) }.to_str().unwrap_or("FD_ERR_?: non-UTF-8 name")
}

/// A failed call: the status and the library's detail message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    /// An INVALID_ARGUMENT raised by the binding before any C call.
    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error { status: Status::InvalidArgument, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Turns a status into a Result. Must run right after the call on the same
/// thread: the message is thread-local and the next FlashDec call may change it.
pub(crate) fn check(raw: sys::fd_status) -> Result<()> {
    if raw == sys::FD_OK {
        return Ok(());
    }
    // SAFETY: never NULL; valid until the next FlashDec call on this thread,
    // and we copy it right away.
    let message = unsafe { CStr::from_ptr(sys::fd_last_error_message()) }.to_string_lossy().into_owned();
    Err(Error { status: Status::from_raw(raw), message })
}
