//! The console's test harness: the console served in the test process on a
//! database of its own, and a client that signs in, keeps its session cookie
//! and CSRF token, and posts forms as a browser would. Shared by
//! `console_access.rs` and `console_actions.rs`; not every file uses every
//! helper, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use batchonce::console::auth::{hash_password, Role, Users};
use batchonce::console::{router, ConsoleOptions, ProxyAuth};
use batchonce::queue::{self, NewRun};
use batchonce::testing::TestDb;
use batchonce::{Clock, JobConfig, JobKey, JobName};
use chrono::NaiveDate;
use reqwest::header::{COOKIE, SET_COOKIE};
use reqwest::StatusCode;
use tokio_util::sync::CancellationToken;

pub const PASSWORD: &str = "correct horse battery";

pub struct Console {
    pub base: String,
    pub db: TestDb,
    stop: CancellationToken,
    pub http: reqwest::Client,
}

impl Drop for Console {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn start(proxy: Option<ProxyAuth>) -> Console {
    let hash = hash_password(PASSWORD).unwrap();
    let users = Users::from_hashes(&[
        ("alice", Role::Operator, hash.clone()),
        ("bob", Role::Operator, hash.clone()),
        ("vera", Role::Viewer, hash),
    ]);
    let mut opts = ConsoleOptions::new("127.0.0.1:0".parse().unwrap(), users);
    opts.proxy = proxy;
    start_with(opts).await
}

/// The console with `opts` (its `listen` decides only the cookies'
/// defaults: the server listens on a free loopback port).
pub async fn start_with(opts: ConsoleOptions) -> Console {
    let db = TestDb::new(&[]).await;
    let pool = db.pool.clone();
    start_on(db, pool, opts).await
}

/// The console on `db` through `pool`, a login of the test's choosing (the
/// console's own role, say), with `opts`.
pub async fn start_on(db: TestDb, pool: sqlx::PgPool, opts: ConsoleOptions) -> Console {
    let app = router(pool, opts).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move { s.cancelled().await })
        .await
        .unwrap();
    });
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    Console {
        base: format!("http://{addr}"),
        db,
        stop,
        http,
    }
}

/// The value of `name` among a response's Set-Cookie headers.
pub fn set_cookie(res: &reqwest::Response, name: &str) -> Option<String> {
    res.headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| {
            let first = c.split(';').next()?;
            let (k, v) = first.split_once('=')?;
            (k == name).then(|| v.to_owned())
        })
}

/// The first hidden `csrf` field of a page.
pub fn csrf_of(body: &str) -> String {
    let at = body.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    body[at..].split('"').next().unwrap().to_owned()
}

/// A signed-in browser: its session cookie and CSRF token.
pub struct Browser {
    pub cookie: String,
    pub csrf: String,
}

impl Console {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Opens the sign-in page and sends its form, as a browser would (the
    /// double-submit token in the cookie and the form), with `user`,
    /// `password` and `next`; the answer.
    pub async fn send_sign_in(&self, user: &str, password: &str, next: &str) -> reqwest::Response {
        let form = self.http.get(self.url("/login")).send().await.unwrap();
        let token = set_cookie(&form, "batchonce_login").expect("login cookie");
        let body = form.text().await.unwrap();
        assert_eq!(csrf_of(&body), token, "double-submit token");
        self.http
            .post(self.url("/login"))
            .header(COOKIE, format!("batchonce_login={token}"))
            .form(&[
                ("csrf", token.as_str()),
                ("user", user),
                ("password", password),
                ("next", next),
            ])
            .send()
            .await
            .unwrap()
    }

    /// Signs in; `Err` is the response of a refused sign-in.
    pub async fn try_login(
        &self,
        user: &str,
        password: &str,
    ) -> Result<Browser, reqwest::Response> {
        let res = self.send_sign_in(user, password, "/").await;
        let Some(cookie) = set_cookie(&res, "batchonce_session") else {
            return Err(res);
        };
        assert_eq!(res.status(), StatusCode::SEE_OTHER);
        let page = self.get_as(&cookie, "/").await;
        assert_eq!(page.status(), StatusCode::OK);
        let csrf = csrf_of(&page.text().await.unwrap());
        Ok(Browser { cookie, csrf })
    }

    pub async fn login(&self, user: &str) -> Browser {
        match self.try_login(user, PASSWORD).await {
            Ok(b) => b,
            Err(res) => panic!("login of {user} refused: {}", res.status()),
        }
    }

    pub async fn get_as(&self, cookie: &str, path: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .header(COOKIE, format!("batchonce_session={cookie}"))
            .send()
            .await
            .unwrap()
    }

    pub async fn post_as(
        &self,
        b: &Browser,
        path: &str,
        form: &[(&str, &str)],
    ) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .header(COOKIE, format!("batchonce_session={}", b.cookie))
            .form(form)
            .send()
            .await
            .unwrap()
    }

    /// Runs of `job` for `dates`, then each put in `status` with `error`.
    pub async fn runs(&self, job: &str, dates: &[(&str, &str, Option<&str>)]) {
        let cfg = JobConfig::default();
        let name = JobName::parse(job).unwrap();
        let new: Vec<NewRun> = dates
            .iter()
            .map(|(d, _, _)| {
                let date = NaiveDate::parse_from_str(d, "%Y-%m-%d").unwrap();
                NewRun::new(JobKey::daily(&name, date), date, &cfg).unwrap()
            })
            .collect();
        queue::enqueue(&self.db.pool, &new, Clock::Db)
            .await
            .unwrap();
        for (d, status, error) in dates {
            // The test's own fixture, as the database owner: a finished run
            // in the state the test needs.
            sqlx::query(
                "UPDATE batch_job_run SET status = $2, attempts = 1, error_message = $3, \
                 finished_at = CASE WHEN $2 IN ('PENDING', 'RUNNING') THEN NULL ELSE now() END \
                 WHERE job_key = $1",
            )
            .bind(format!("{job}:{d}"))
            .bind(status)
            .bind(error)
            .execute(&self.db.pool)
            .await
            .unwrap();
        }
    }
}
