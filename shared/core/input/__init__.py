"""Human input, pure: the request/answer events, their fold, who is asked, and respond's decisions."""
