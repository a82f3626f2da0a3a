//! The tabs that may hold a reserve ([`super::reserve`]), kept by the intake so that an intent
//! on any other tab does not ask the books for its reserves.

use crate::books::Books;
use crate::error::Result;
use std::collections::HashSet;

/// Tabs that may hold a reserve, so that an intent on any other tab (most of them) goes to spot
/// without asking the books for its reserves. Read from the books at the first intent; a reserve
/// accepted through this intake adds its tab before it is written. Only the writer accepts
/// reserves (the books refuse another node's writes), and each writer's intake starts anew.
#[derive(Debug, Default)]
pub(crate) struct ReserveTabs(tokio::sync::OnceCell<Known>);

/// The tabs known to hold a reserve; `None` once there were too many to keep (every intent then
/// asks the books).
type Known = std::sync::Mutex<Option<HashSet<(u64, u64)>>>;

/// Tabs [`ReserveTabs`] keeps at most; past it, every intent asks the books.
const RESERVE_TABS_KEPT: usize = 1_000_000;

impl ReserveTabs {
    async fn known(&self, books: &Books, now_s: u64) -> Result<&Known> {
        self.0
            .get_or_try_init(|| async {
                let tabs = books.reserve_tabs(now_s).await?;
                Ok(std::sync::Mutex::new(Some(tabs.into_iter().collect())))
            })
            .await
    }

    /// Whether tab `tab` may hold a reserve live at `now_s` (true: ask the books).
    pub(crate) async fn may_hold(
        &self,
        books: &Books,
        tab: (u64, u64),
        now_s: u64,
    ) -> Result<bool> {
        let known = self.known(books, now_s).await?;
        let known = known.lock().unwrap_or_else(|e| e.into_inner());
        Ok(known.as_ref().is_none_or(|tabs| tabs.contains(&tab)))
    }

    /// A reserve on tab `tab` is about to be written.
    pub(crate) async fn add(&self, books: &Books, tab: (u64, u64), now_s: u64) -> Result<()> {
        let known = self.known(books, now_s).await?;
        let mut known = known.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tabs) = known.as_mut() {
            if tabs.len() >= RESERVE_TABS_KEPT {
                *known = None;
            } else {
                tabs.insert(tab);
            }
        }
        Ok(())
    }
}
