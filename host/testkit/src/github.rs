//! A GitHub `issue_comment.created` delivery shaped like the real thing:
//! the issue, the comment, the repository and the sender with the fields
//! GitHub sends (about 10 KB), so a benchmark of the webhook path signs,
//! ships and parses what a real delivery costs rather than a one-liner.

use serde_json::{Value, json};

fn user(login: &str, id: u64) -> Value {
    let api = format!("https://api.github.com/users/{login}");
    json!({
        "login": login,
        "id": id,
        "node_id": format!("MDQ6VXNlcj{id}"),
        "avatar_url": format!("https://avatars.githubusercontent.com/u/{id}?v=4"),
        "gravatar_id": "",
        "url": api,
        "html_url": format!("https://github.com/{login}"),
        "followers_url": format!("{api}/followers"),
        "following_url": format!("{api}/following{{/other_user}}"),
        "gists_url": format!("{api}/gists{{/gist_id}}"),
        "starred_url": format!("{api}/starred{{/owner}}{{/repo}}"),
        "subscriptions_url": format!("{api}/subscriptions"),
        "organizations_url": format!("{api}/orgs"),
        "repos_url": format!("{api}/repos"),
        "events_url": format!("{api}/events{{/privacy}}"),
        "received_events_url": format!("{api}/received_events"),
        "type": "User",
        "user_view_type": "public",
        "site_admin": false
    })
}

fn repository(full_name: &str) -> Value {
    let (owner, name) = full_name.split_once('/').expect("owner/name");
    let api = format!("https://api.github.com/repos/{full_name}");
    let mut repo = json!({
        "id": 781_234_567u64,
        "node_id": "R_kgDOLpZ0hw",
        "name": name,
        "full_name": full_name,
        "private": true,
        "owner": user(owner, 160_123_456),
        "html_url": format!("https://github.com/{full_name}"),
        "description": "The robot that answers when it is mentioned",
        "fork": false,
        "url": api,
        "created_at": "2026-04-02T09:12:44Z",
        "updated_at": "2026-11-29T17:40:02Z",
        "pushed_at": "2026-11-30T07:58:31Z",
        "git_url": format!("git://github.com/{full_name}.git"),
        "ssh_url": format!("git@github.com:{full_name}.git"),
        "clone_url": format!("https://github.com/{full_name}.git"),
        "svn_url": format!("https://github.com/{full_name}"),
        "homepage": null,
        "size": 18_422,
        "stargazers_count": 12,
        "watchers_count": 12,
        "language": "Rust",
        "has_issues": true,
        "has_projects": true,
        "has_downloads": true,
        "has_wiki": false,
        "has_pages": false,
        "has_discussions": false,
        "forks_count": 1,
        "mirror_url": null,
        "archived": false,
        "disabled": false,
        "open_issues_count": 37,
        "license": null,
        "allow_forking": false,
        "is_template": false,
        "web_commit_signoff_required": false,
        "topics": ["agents", "automation"],
        "visibility": "private",
        "forks": 1,
        "open_issues": 37,
        "watchers": 12,
        "default_branch": "main"
    });
    for (field, suffix) in [
        ("forks_url", "/forks"),
        ("keys_url", "/keys{/key_id}"),
        ("collaborators_url", "/collaborators{/collaborator}"),
        ("teams_url", "/teams"),
        ("hooks_url", "/hooks"),
        ("issue_events_url", "/issues/events{/number}"),
        ("events_url", "/events"),
        ("assignees_url", "/assignees{/user}"),
        ("branches_url", "/branches{/branch}"),
        ("tags_url", "/tags"),
        ("blobs_url", "/git/blobs{/sha}"),
        ("git_tags_url", "/git/tags{/sha}"),
        ("git_refs_url", "/git/refs{/sha}"),
        ("trees_url", "/git/trees{/sha}"),
        ("statuses_url", "/statuses/{sha}"),
        ("languages_url", "/languages"),
        ("stargazers_url", "/stargazers"),
        ("contributors_url", "/contributors"),
        ("subscribers_url", "/subscribers"),
        ("subscription_url", "/subscription"),
        ("commits_url", "/commits{/sha}"),
        ("git_commits_url", "/git/commits{/sha}"),
        ("comments_url", "/comments{/number}"),
        ("issue_comment_url", "/issues/comments{/number}"),
        ("contents_url", "/contents/{+path}"),
        ("compare_url", "/compare/{base}...{head}"),
        ("merges_url", "/merges"),
        ("archive_url", "/{archive_format}{/ref}"),
        ("downloads_url", "/downloads"),
        ("issues_url", "/issues{/number}"),
        ("pulls_url", "/pulls{/number}"),
        ("milestones_url", "/milestones{/number}"),
        (
            "notifications_url",
            "/notifications{?since,all,participating}",
        ),
        ("labels_url", "/labels{/name}"),
        ("releases_url", "/releases{/id}"),
        ("deployments_url", "/deployments"),
    ] {
        repo[field] = Value::String(format!("{api}{suffix}"));
    }
    repo
}

/// The JSON body of an `issue_comment` delivery on issue `number` of
/// `repo`, whose comment says `comment`.
pub fn issue_comment(repo: &str, number: u64, comment: &str) -> Vec<u8> {
    let issue_api = format!("https://api.github.com/repos/{repo}/issues/{number}");
    let label = |id: u64, name: &str, color: &str| {
        json!({
            "id": id,
            "node_id": format!("LA_kwDOLpZ0h88AAAAB{id}"),
            "url": format!("https://api.github.com/repos/{repo}/labels/{name}"),
            "name": name,
            "color": color,
            "default": false,
            "description": format!("Work of the {name} kind")
        })
    };
    let body = json!({
        "action": "created",
        "issue": {
            "url": issue_api,
            "repository_url": format!("https://api.github.com/repos/{repo}"),
            "labels_url": format!("{issue_api}/labels{{/name}}"),
            "comments_url": format!("{issue_api}/comments"),
            "events_url": format!("{issue_api}/events"),
            "html_url": format!("https://github.com/{repo}/issues/{number}"),
            "id": 2_690_000_000u64 + number,
            "node_id": "I_kwDOLpZ0h86gVbXk",
            "number": number,
            "title": "The nightly export stops after the first page",
            "user": user("grace", 5_551_234),
            "labels": [label(7_001, "bug", "d73a4a"), label(7_002, "export", "0e8a16")],
            "state": "open",
            "locked": false,
            "assignee": null,
            "assignees": [],
            "milestone": null,
            "comments": 3,
            "created_at": "2026-11-28T16:02:11Z",
            "updated_at": "2026-11-30T08:01:45Z",
            "closed_at": null,
            "author_association": "MEMBER",
            "type": null,
            "active_lock_reason": null,
            "sub_issues_summary": {"total": 0, "completed": 0, "percent_completed": 0},
            "body": "Since Tuesday the nightly export writes the first 100 rows and stops.\n\nSteps:\n1. run the export for any account with more than 100 orders\n2. open the file\n\nExpected every order; got the first page only. The job log says nothing.",
            "reactions": {
                "url": format!("{issue_api}/reactions"),
                "total_count": 0, "+1": 0, "-1": 0, "laugh": 0, "hooray": 0,
                "confused": 0, "heart": 0, "rocket": 0, "eyes": 0
            },
            "timeline_url": format!("{issue_api}/timeline"),
            "performed_via_github_app": null,
            "state_reason": null
        },
        "comment": {
            "url": format!("https://api.github.com/repos/{repo}/issues/comments/2511223344"),
            "html_url": format!("https://github.com/{repo}/issues/{number}#issuecomment-2511223344"),
            "issue_url": issue_api,
            "id": 2_511_223_344u64,
            "node_id": "IC_kwDOLpZ0h86VrRkw",
            "user": user("grace", 5_551_234),
            "created_at": "2026-11-30T08:01:45Z",
            "updated_at": "2026-11-30T08:01:45Z",
            "author_association": "MEMBER",
            "body": comment,
            "reactions": {
                "url": format!("https://api.github.com/repos/{repo}/issues/comments/2511223344/reactions"),
                "total_count": 0, "+1": 0, "-1": 0, "laugh": 0, "hooray": 0,
                "confused": 0, "heart": 0, "rocket": 0, "eyes": 0
            },
            "performed_via_github_app": null
        },
        "repository": repository(repo),
        "organization": {
            "login": repo.split_once('/').map_or(repo, |(o, _)| o),
            "id": 160_123_456,
            "node_id": "O_kgDOCYtXgA",
            "url": "https://api.github.com/orgs/acme",
            "repos_url": "https://api.github.com/orgs/acme/repos",
            "events_url": "https://api.github.com/orgs/acme/events",
            "hooks_url": "https://api.github.com/orgs/acme/hooks",
            "issues_url": "https://api.github.com/orgs/acme/issues",
            "members_url": "https://api.github.com/orgs/acme/members{/member}",
            "public_members_url": "https://api.github.com/orgs/acme/public_members{/member}",
            "avatar_url": "https://avatars.githubusercontent.com/u/160123456?v=4",
            "description": "Acme, the company of robots"
        },
        "sender": user("grace", 5_551_234)
    });
    serde_json::to_vec(&body).expect("a JSON value serialises")
}
