//! What the process asks of the system's allocator (glibc's), so that its resident memory
//! follows what it holds: large buffers go back when freed, and what a start-up or a reload
//! freed is returned once it is done.

/// Allocations of 4 MiB and more are mapped on their own and unmapped when freed (glibc's
/// `M_MMAP_THRESHOLD`, fixed instead of its default that rises to the size of the largest
/// block freed): an argon2 buffer, or a large answer read and dropped, then goes back to the
/// system instead of staying in the process's heap. Called at start, before any thread.
#[allow(unsafe_code, reason = "one call setting an allocator parameter")]
pub fn return_large_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets a parameter of the allocator; it takes no pointers.
    unsafe {
        nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, 4 << 20);
    }
}

/// Gives the system back the free pages of every heap: after a pool is loaded (the documents
/// parsed and dropped, the previous pool freed), the heap holds whole pages nothing uses.
#[allow(unsafe_code, reason = "one call to the allocator")]
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointers and only releases pages the allocator holds free.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}
