//! `gpumux worker` (hidden): the child side of `process` mode, which reads its request on stdin.

use gpumux::error::Error;

pub fn run() -> Result<(), Error> {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    gpumux::sched::process::worker_main(&mut stdin.lock(), &mut stdout.lock()).map_err(Error::Usage)
}
