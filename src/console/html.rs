//! The console's page frame, style sheet and small pieces of markup. Every
//! page is rendered with `maud`, which escapes every interpolated string: a
//! job's error message containing `<script>` is shown as text. Nothing here
//! reads the database.
//!
//! Text meets WCAG AA: every text colour of the style sheet is checked
//! against each background it is drawn on, for a contrast of 4.5:1 or more,
//! by a unit test that reads the colours from [`CSS`] itself.

use chrono::{DateTime, Utc};
use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::auth::{Role, Session};

/// The style sheet, served from `/console.css` (the Content-Security-Policy
/// allows no inline style and no script at all).
pub const CSS: &str = r#"
:root { --ok:#1a7f37; --fail:#cf222e; --run:#0969da; --pend:#9a6700; --skip:#6e7781; --miss:#ffffff; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1f2328; background: #f6f8fa; }
header { background: #24292f; color: #fff; padding: 8px 16px; display: flex; gap: 16px; align-items: center; flex-wrap: wrap; }
header a { color: #fff; text-decoration: none; }
header nav { display: flex; gap: 16px; flex-wrap: wrap; }
a { color: #0550ae; }
header .who { margin-left: auto; }
header form { display: inline; }
main { padding: 16px; max-width: 1400px; }
h1 { font-size: 20px; margin: 0 0 12px; }
h2 { font-size: 16px; margin: 20px 0 8px; }
table { border-collapse: collapse; background: #fff; width: 100%; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #eaeef2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font: 12px ui-monospace, monospace; }
pre { background: #fff; border: 1px solid #d0d7de; padding: 8px; white-space: pre-wrap; word-break: break-all; margin: 4px 0; }
.badge { display: inline-block; padding: 0 6px; border-radius: 10px; color: #fff; font-size: 12px; }
.SUCCEEDED { background: var(--ok); } .FAILED { background: var(--fail); } .RUNNING { background: var(--run); }
.PENDING { background: var(--pend); } .SKIPPED { background: var(--skip); } .PAUSED { background: #8250df; }
.MISSING { background: var(--miss); color: #cf222e; border: 1px dashed #cf222e; }
.cal { display: grid; grid-template-columns: repeat(auto-fill, minmax(120px, 1fr)); gap: 4px; }
.cell { display: block; padding: 4px; border-radius: 4px; color: #fff; text-decoration: none; font-size: 12px; min-height: 44px; }
.cell.MISSING { color: #cf222e; }
.ARCHIVED { background: #d0d7de; color: #1f2328; }
table.weeks { table-layout: fixed; }
table.weeks th { text-align: center; }
table.weeks td { padding: 2px; height: 64px; }
table.weeks td.out { background: #f6f8fa; }
table.weeks td.none { color: #57606a; font-size: 12px; }
label.pick { display: block; font-size: 12px; color: #1f2328; }
.banner { font-weight: 600; }
.refresh { float: right; font-size: 12px; }
ul.compact { margin: 2px 0 0; padding-left: 16px; font-size: 12px; }
svg.chart { background: #fff; border: 1px solid #d0d7de; vertical-align: middle; }
svg.chart .bar { fill: #0969da; }
svg.chart .bar.ok { fill: var(--ok); }
svg.chart .bar.failed { fill: var(--fail); }
svg.chart .bar.pending, svg.chart .bar.skipped { fill: var(--skip); }
svg.chart .items { fill: none; stroke: #9a6700; stroke-width: 1.5; }
svg.chart .mark { fill: var(--fail); font-size: 10px; font-weight: 700; }
svg.chart .axis { fill: #6e7781; font-size: 10px; }
.note { background: #fff8c5; border: 1px solid #d4a72c; padding: 8px; margin: 8px 0; }
.error { background: #ffebe9; border: 1px solid #cf222e; padding: 8px; margin: 8px 0; }
.done { background: #dafbe1; border: 1px solid #1a7f37; padding: 8px; margin: 8px 0; }
form.filter { display: flex; gap: 8px; flex-wrap: wrap; align-items: end; margin-bottom: 12px; }
form.filter label, form.act label { display: flex; flex-direction: column; font-size: 12px; }
form.act { background: #fff; border: 1px solid #d0d7de; padding: 8px; margin: 8px 0; display: flex; gap: 8px; flex-wrap: wrap; align-items: end; }
input[type=text], input[type=password], input[type=date], select { font: inherit; padding: 3px 6px; }
input.reason { min-width: 320px; }
button { font: inherit; padding: 3px 10px; cursor: pointer; }
.muted { color: #57606a; }
.login { max-width: 360px; margin: 60px auto; background: #fff; border: 1px solid #d0d7de; padding: 20px; }
.login label { display: block; margin: 8px 0; }
.login input { width: 100%; }
"#;

/// Seconds after which a page that refreshes itself reloads.
pub const REFRESH_SECONDS: u32 = 10;

/// A whole page: the header with navigation and the signed-in user, then
/// `body`.
pub fn page(title: &str, session: &Session, body: Markup) -> Markup {
    page_with(title, session, body, None)
}

/// [`page`], reloading itself every `refresh` seconds when set: a meta
/// refresh, since the page runs no script.
pub fn page_with(title: &str, session: &Session, body: Markup, refresh: Option<u32>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title, refresh))
            body {
                header {
                    strong { a href="/" { "batchonce" } }
                    nav aria-label="Main" {
                        a href="/" { "Overview" }
                        a href="/runs" { "Runs" }
                        a href="/scopes" { "Scopes" }
                        a href="/stale" { "Stale" }
                        a href="/audit" { "Audit log" }
                        a href="/workers" { "Workers" }
                    }
                    span.who {
                        (session.user.name) " (" (session.user.role.as_str()) ") "
                        @if !session.proxied {
                            form method="post" action="/logout" {
                                input type="hidden" name="csrf" value=(session.csrf);
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// A page for someone not signed in (the login form, errors).
pub fn bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title, None))
            body { (body) }
        }
    }
}

fn head(title: &str, refresh: Option<u32>) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            @if let Some(s) = refresh { meta http-equiv="refresh" content=(s); }
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · batchonce" }
            link rel="stylesheet" href="/console.css";
        }
    }
}

/// Whether a page refreshes itself, from its `refresh` query value: on
/// unless it is `off`.
pub fn refresh_on(value: Option<&str>) -> bool {
    value != Some("off")
}

/// The link that turns a page's refresh off (to `path` with
/// `refresh=off`) or back on (to `path`); `path` may carry a query.
pub fn refresh_toggle(path: &str, on: bool) -> Markup {
    let sep = if path.contains('?') { '&' } else { '?' };
    html! {
        p.refresh {
            @if on {
                "Refreshes every " (REFRESH_SECONDS) " s. "
                a href={ (path) (sep) "refresh=off" } { "Stop refreshing" }
            } @else {
                "Not refreshing. " a href=(path) { "Refresh every " (REFRESH_SECONDS) " s" }
            }
        }
    }
}

/// A run state as a coloured badge.
pub fn badge(status: &str) -> Markup {
    // The class is one of the known states or nothing: a state string from
    // the database never becomes markup.
    let class = match status {
        "SUCCEEDED" | "FAILED" | "RUNNING" | "PENDING" | "SKIPPED" | "MISSING" | "ARCHIVED"
        | "PAUSED" => status,
        _ => "",
    };
    html! { span class={ "badge " (class) } { (status) } }
}

/// An instant as the database gave it, in UTC, to the second.
pub fn at(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// An optional instant, or a dash.
pub fn at_opt(t: Option<DateTime<Utc>>) -> String {
    t.map(at).unwrap_or_else(|| "—".into())
}

/// Seconds as a short duration: `42 s`, `7 min`, `3.5 h`, `2.0 d`.
pub fn age(seconds: f64) -> String {
    let s = seconds.max(0.0);
    if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else if s < 172_800.0 {
        format!("{:.1} h", s / 3600.0)
    } else {
        format!("{:.1} d", s / 86_400.0)
    }
}

/// The path of a run's page; the key is percent-encoded.
pub fn run_href(key: &str) -> String {
    format!("/runs/{}", encode(key))
}

/// Percent-encodes `s` for a path segment or a query value.
pub fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// A message box.
pub fn message(class: &str, text: &str) -> Markup {
    let class = match class {
        "error" | "done" | "note" => class,
        _ => "note",
    };
    html! { div class=(class) { (text) } }
}

/// Whether `role` may act.
pub fn may_act(role: Role) -> bool {
    role == Role::Operator
}

/// A non-breaking space, for empty cells.
pub fn nbsp() -> Markup {
    PreEscaped("&nbsp;".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The declarations of every rule of [`CSS`], by selector (a rule with
    /// several selectors is listed under each), later rules winning.
    fn rules() -> BTreeMap<String, BTreeMap<String, String>> {
        let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for rule in CSS.split('}') {
            let Some((selectors, body)) = rule.split_once('{') else {
                continue;
            };
            for sel in selectors.split(',') {
                let decls = out.entry(sel.trim().to_owned()).or_default();
                for d in body.split(';') {
                    if let Some((k, v)) = d.split_once(':') {
                        decls.insert(k.trim().to_owned(), v.trim().to_owned());
                    }
                }
            }
        }
        out
    }

    /// A colour value as `#rrggbb`, through the `:root` variables.
    fn resolve(rules: &BTreeMap<String, BTreeMap<String, String>>, v: &str) -> String {
        let v = v.split_whitespace().next().unwrap_or(v);
        if let Some(name) = v.strip_prefix("var(").and_then(|n| n.strip_suffix(')')) {
            return resolve(rules, &rules[":root"][name]);
        }
        let hex = v.trim_start_matches('#');
        let hex = if hex.len() == 3 {
            hex.chars().flat_map(|c| [c, c]).collect()
        } else {
            hex.to_owned()
        };
        assert_eq!(hex.len(), 6, "{v} is not a colour the test reads");
        format!("#{}", hex.to_ascii_lowercase())
    }

    /// WCAG 2's contrast ratio of two `#rrggbb` colours.
    fn contrast(a: &str, b: &str) -> f64 {
        let lum = |h: &str| {
            let c = |i: usize| {
                let v = f64::from(u8::from_str_radix(&h[i..i + 2], 16).unwrap()) / 255.0;
                if v <= 0.03928 {
                    v / 12.92
                } else {
                    ((v + 0.055) / 1.055).powf(2.4)
                }
            };
            0.2126 * c(1) + 0.7152 * c(3) + 0.0722 * c(5)
        };
        let (x, y) = (lum(a), lum(b));
        (x.max(y) + 0.05) / (x.min(y) + 0.05)
    }

    #[test]
    fn every_text_colour_meets_wcag_aa_on_every_background_it_is_drawn_on() {
        let rules = rules();
        let colour = |sel: &str, prop: &str| {
            let v = rules
                .get(sel)
                .and_then(|d| d.get(prop))
                .unwrap_or_else(|| panic!("{sel} has no {prop}"));
            resolve(&rules, v)
        };
        // (the rule giving the text colour, the rule giving the background
        // it is drawn on): text inherits the body's colour unless its rule
        // sets one, and sits on the page, a table cell, a header cell, a
        // message box or a badge.
        let boxes = [
            "body", "table", "th", "pre", ".note", ".error", ".done", ".login", "form.act",
        ];
        let states = [
            ".SUCCEEDED",
            ".FAILED",
            ".RUNNING",
            ".PENDING",
            ".SKIPPED",
            ".PAUSED",
        ];
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        for bg in boxes {
            pairs.push(("body", bg));
            pairs.push(("a", bg));
        }
        for bg in ["body", "table", ".note", ".error", ".done"] {
            pairs.push((".muted", bg));
        }
        pairs.extend([("header", "header"), ("header a", "header")]);
        for bg in states {
            pairs.push((".badge", bg));
            pairs.push((".cell", bg));
        }
        pairs.extend([
            (".MISSING", ".MISSING"),
            (".cell.MISSING", ".MISSING"),
            (".ARCHIVED", ".ARCHIVED"),
            ("table.weeks td.none", "table"),
            ("label.pick", "table"),
        ]);
        let mut checked = std::collections::BTreeSet::new();
        for (fg_sel, bg_rule) in &pairs {
            let fg = colour(fg_sel, "color");
            let bg = match rules.get(*bg_rule).and_then(|d| d.get("background")) {
                Some(v) => resolve(&rules, v),
                None => colour(bg_rule, "background-color"),
            };
            let ratio = contrast(&fg, &bg);
            assert!(
                ratio >= 4.5,
                "{fg_sel} ({fg}) on {bg_rule} ({bg}): {ratio:.2}:1, below 4.5:1"
            );
            checked.insert(fg);
        }
        // Every text colour of the sheet is among those checked, so a new
        // one cannot slip in unchecked.
        for (sel, decls) in &rules {
            if let Some(v) = decls.get("color") {
                let c = resolve(&rules, v);
                assert!(checked.contains(&c), "{sel}'s colour {c} is not checked");
            }
        }
        // The numbers themselves, as WCAG computes them.
        assert!((contrast("#ffffff", "#000000") - 21.0).abs() < 1e-9);
        assert!((contrast("#777777", "#ffffff") - 4.48).abs() < 0.01);
    }
}
