//! Stopping the sandbox's processes for the short second pass of a capture.

/// Freezes and thaws the processes that can write the layers (the daemon
/// implements it on the sandbox's cgroup freezer).
pub trait Freezer {
    fn freeze(&self) -> Result<(), String>;
    fn thaw(&self) -> Result<(), String>;
}

/// For a sandbox that is not running (and for tests): nothing to stop.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoFreeze;

impl Freezer for NoFreeze {
    fn freeze(&self) -> Result<(), String> {
        Ok(())
    }
    fn thaw(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Thaws on [`Frozen::thaw`] or, if that was never reached (an error or a
/// panic in between), on drop: a sandbox is never left frozen.
pub(crate) struct Frozen<'a> {
    freezer: &'a dyn Freezer,
    thawed: bool,
}

impl<'a> Frozen<'a> {
    /// Freezes; a failed freeze is thawed at once (it may have half worked).
    pub fn new(freezer: &'a dyn Freezer) -> crate::Result<Frozen<'a>> {
        let guard = Frozen { freezer, thawed: false };
        freezer.freeze().map_err(crate::Error::Freeze)?;
        Ok(guard)
    }

    pub fn thaw(mut self) -> crate::Result<()> {
        self.thawed = true;
        self.freezer.thaw().map_err(crate::Error::Thaw)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        if !self.thawed {
            if let Err(e) = self.freezer.thaw() {
                tracing::error!("cannot thaw the sandbox after a failed capture: {e}");
            }
        }
    }
}

impl std::fmt::Debug for Frozen<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frozen").field("thawed", &self.thawed).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    #[derive(Default)]
    struct Calls {
        log: RefCell<Vec<&'static str>>,
        fail_freeze: bool,
    }

    impl Freezer for Calls {
        fn freeze(&self) -> Result<(), String> {
            self.log.borrow_mut().push("freeze");
            if self.fail_freeze {
                return Err("no".into());
            }
            Ok(())
        }
        fn thaw(&self) -> Result<(), String> {
            self.log.borrow_mut().push("thaw");
            Ok(())
        }
    }

    #[test]
    fn thaws_exactly_once_whatever_happens() {
        let c = Calls::default();
        Frozen::new(&c).unwrap().thaw().unwrap();
        assert_eq!(*c.log.borrow(), ["freeze", "thaw"]);

        let c = Calls::default();
        drop(Frozen::new(&c).unwrap());
        assert_eq!(*c.log.borrow(), ["freeze", "thaw"]);

        let c = Calls { fail_freeze: true, ..Calls::default() };
        assert!(matches!(Frozen::new(&c), Err(crate::Error::Freeze(_))));
        assert_eq!(*c.log.borrow(), ["freeze", "thaw"]);
    }
}
