// `sqlx::migrate!` embeds the migrations folder: a new migration must rebuild the crate
// (sqlx's documented build script).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
