"""Word pools for the synthetic data, each split into a training part and a held-out part.

Everything here was written for brisklm (no third-party text). Held-out pools never appear in
training data, so the evaluation measures copying and generalisation, not memorisation.
"""

from __future__ import annotations

# (verb in a function name, verb phrase in a description/request)
VERBS = [
    ("get", "get"), ("fetch", "fetch"), ("find", "find"), ("lookup", "look up"), ("search", "search"),
    ("create", "create"), ("update", "update"), ("delete", "delete"), ("send", "send"),
    ("book", "book"), ("cancel", "cancel"), ("convert", "convert"), ("calculate", "calculate"),
    ("check", "check"), ("list", "list"), ("set", "set"), ("schedule", "schedule"), ("add", "add"),
    ("remove", "remove"), ("translate", "translate"), ("play", "play"), ("order", "order"),
    ("reserve", "reserve"), ("track", "track"), ("compute", "compute"), ("count", "count"),
    ("start", "start"), ("stop", "stop"), ("open", "open"), ("close", "close"), ("rate", "rate"),
    ("share", "share"), ("upload", "upload"), ("download", "download"), ("scan", "scan"),
    ("reset", "reset"), ("record", "record"), ("estimate", "estimate"), ("compare", "compare"),
    ("summarize", "summarize"), ("notify", "notify about"), ("measure", "measure"), ("show", "show"),
    ("generate", "generate"), ("validate", "validate"), ("archive", "archive"), ("rename", "rename"),
    ("register", "register"), ("query", "query"), ("predict", "predict"),
]
HELDOUT_VERBS = [
    ("inspect", "inspect"), ("locate", "locate"), ("refresh", "refresh"), ("assign", "assign"),
    ("publish", "publish"), ("forecast", "forecast"), ("restore", "restore"), ("approve", "approve"),
]

TOPICS = [
    "weather", "forecast", "stock price", "exchange rate", "flight", "hotel room", "email",
    "reminder", "alarm", "timer", "calendar event", "meeting", "song", "playlist", "recipe",
    "restaurant", "taxi", "train ticket", "package", "order", "invoice", "payment",
    "account balance", "news", "movie", "book", "note", "task", "contact", "message", "photo",
    "file", "folder", "password", "route", "distance", "population", "time zone", "translation",
    "dictionary entry", "temperature", "humidity", "air quality", "traffic", "parking spot",
    "bus schedule", "sunrise time", "shopping list", "grocery order", "pizza", "coffee",
    "appointment", "thermostat", "door lock", "printer", "battery level", "volume", "brightness",
    "user profile", "support ticket", "invoice total", "shipping cost", "tax rate", "loan payment",
    "currency", "recipe list", "workout", "step count", "heart rate", "sleep score", "calories",
    "podcast", "radio station", "video", "comment", "review", "rating", "product", "cart",
    "coupon", "discount", "gift card", "subscription", "license", "server status", "log entry",
    "database record", "backup", "report", "chart", "spreadsheet", "document", "slide deck",
    "survey", "poll", "vote", "score", "match result", "team roster", "player stats", "ticket price",
    "concert", "museum", "library book", "course", "lesson", "quiz", "homework", "grade",
    "vaccine record", "prescription", "doctor visit", "pet food", "garden plan", "plant watering",
    "recycling day", "electricity usage", "water meter", "solar output", "wind speed", "snow depth",
    "earthquake report", "flight status", "seat map", "baggage claim", "car rental", "fuel price",
    "charging station", "bike share", "ferry schedule", "hiking trail", "campsite", "ski pass",
]
HELDOUT_TOPICS = [
    "tide table", "moon phase", "pollen count", "lighthouse", "violin lesson", "wine pairing",
    "beehive", "telescope", "sailing permit", "chess puzzle", "glacier", "volcano alert",
    "orchard harvest", "pottery class", "kayak rental", "bakery order", "fossil record",
    "meteor shower", "aquarium ticket", "harbor fee",
]

# Syllables for pseudo-words: nonsense names teach copying rather than memorising.
SYLLABLES = [
    "ka", "lo", "mi", "ru", "ze", "ta", "po", "ni", "vex", "dar", "quo", "lin", "tor", "bel", "sin",
    "gra", "fen", "mur", "zal", "kip", "rho", "dun", "sa", "te", "ox", "ul", "bri", "cor", "nav",
    "pel", "wix", "yo", "jun", "hal", "ek", "ras", "mon", "tiv", "zu", "fa",
]
HELDOUT_SYLLABLES = ["qua", "xim", "bop", "glu", "thra", "vy", "oom", "pik", "sno", "dwe"]

ARG_NAMES = [
    "city", "location", "date", "amount", "currency", "from_currency", "to_currency", "name",
    "email", "message", "subject", "recipient", "count", "limit", "quantity", "price", "unit",
    "language", "query", "title", "time", "duration", "minutes", "level", "id", "user_id",
    "order_id", "color", "size", "category", "priority", "latitude", "longitude", "year", "month",
    "day", "hour", "text", "url", "path", "filename", "code", "country", "region", "address",
    "phone", "note", "tag", "label", "mode", "format", "source", "target", "origin", "destination",
    "passengers", "guests", "rooms", "nights", "budget", "rating", "score", "speed", "distance",
    "weight", "height", "width", "depth", "volume", "percent", "offset", "page", "max_results",
    "start_date", "end_date", "timezone", "units", "verbose", "enabled", "force", "dry_run",
    "include_details", "sort_by", "order", "artist", "album", "song", "genre", "author", "isbn",
    "product_id", "sku", "coupon_code", "account", "username", "password", "status", "reason",
    "comment", "description", "channel", "device", "room", "floor", "team", "player", "season",
    "league", "symbol", "exchange", "ticker", "interval", "threshold", "radius", "zoom",
]
HELDOUT_ARG_NAMES = [
    "harbor", "altitude", "vessel_name", "wingspan", "vintage", "tempo", "grain_size", "orbit",
    "tide_level", "hive_id", "kiln_temp", "berth", "voltage_limit", "crater", "lens_width",
    "bloom_stage", "anchor_depth", "frost_days", "pitch_class", "ridge",
]

FIRST_NAMES = [
    "Alice", "Bob", "Maria", "John", "Emma", "Liam", "Olivia", "Noah", "Ava", "Lucas", "Mia",
    "Ethan", "Sofia", "Mateo", "Chloe", "Arjun", "Priya", "Wei", "Yuki", "Hiro", "Fatima", "Omar",
    "Zoë", "José", "Søren", "Ingrid", "Lars", "Anna", "Pierre", "Chloé", "Amélie", "Jürgen",
    "Björn", "Elif", "Mehmet", "Aisha", "Kwame", "Nia", "Diego", "Lucía", "Ivan", "Olga", "Tom",
    "Sara", "David", "Grace", "Henry", "Isla", "Jack", "Kate", "Leo", "Mila", "Nora", "Oscar",
    "Paul", "Rosa", "Sam", "Tina", "Uma", "Victor", "Wendy", "Xavier", "Yara", "Zane", "Ben",
    "Clara", "Dan", "Eva", "Finn", "Gina", "Hugo", "Ida", "Jonas", "Lena", "Max", "Nina", "Otto",
    "Pia", "Rafael", "Selin", "Theo", "Vera", "Will", "Ayumi", "Chen", "Li", "Minh", "Ravi",
    "美咲", "翔太", "伟", "娜",
]
LAST_NAMES = [
    "Smith", "Lopez", "Brown", "Garcia", "Müller", "Schmidt", "Rossi", "Dubois", "Tanaka", "Sato",
    "Kim", "Park", "Nguyen", "Patel", "Singh", "Khan", "Ali", "Okafor", "Mensah", "Silva", "Santos",
    "Novak", "Kowalski", "Johansson", "Nielsen", "Hansen", "Jensen", "Ivanova", "Petrov", "Cohen",
    "Levi", "O'Brien", "Murphy", "Walsh", "Taylor", "Wilson", "Clark", "Lewis", "Young", "Hall",
    "Allen", "King", "Wright", "Scott", "Green", "Baker", "Adams", "Nelson", "Hill", "Moore",
    "Martin", "Jackson", "White", "Harris", "Thompson", "Moreau", "Fischer", "Weber", "Wagner",
    "Becker", "Hoffmann", "Ricci", "Bianchi", "Fernández", "Gómez", "Pérez", "Çelik", "Yılmaz",
    "Zhang", "Wang", "Liu", "Chen", "Yamamoto", "Watanabe", "鈴木", "田中", "王", "李",
]
HELDOUT_FIRST_NAMES = [
    "Beatrix", "Cosimo", "Dagny", "Eamon", "Fiorella", "Gwendolyn", "Hamish", "Ilse", "Joaquín",
    "Kalani", "Leopold", "Marisol", "Niamh", "Orla", "Peregrine", "Quentin", "Rowena", "Saoirse",
    "Thaddeus", "Ulrike", "Wilhelmina", "Yevgenia", "Zoltán", "Ottilie", "真由美", "健太",
]
HELDOUT_LAST_NAMES = [
    "Abernathy", "Brannigan", "Castellanos", "Drummond", "Eriksdóttir", "Fairweather",
    "Grünewald", "Halvorsen", "Iwasaki", "Jablonski", "Kowalczyk", "Lindqvist", "Montgomery",
    "Nakamura", "Oyelaran", "Pemberton", "Quiñones", "Rautenberg", "Szabó", "Thorvaldsen",
    "小林", "高橋",
]

PLACES = [
    "Paris", "London", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Prague", "Warsaw", "Oslo",
    "Stockholm", "Helsinki", "Copenhagen", "Dublin", "Amsterdam", "Brussels", "Zürich", "Geneva",
    "München", "Köln", "Düsseldorf", "Malmö", "Göteborg", "Kraków", "Łódź", "Brno", "Tromsø",
    "São Paulo", "Rio de Janeiro", "Bogotá", "Lima", "Santiago", "Buenos Aires", "México",
    "Montréal", "Québec", "Toronto", "Chicago", "Boston", "Denver", "Seattle", "Austin", "Miami",
    "New York", "Los Angeles", "Cairo", "Nairobi", "Lagos", "Accra", "Cape Town", "Dubai",
    "Istanbul", "Ankara", "Athens", "Delhi", "Mumbai", "Bangalore", "Dhaka", "Bangkok", "Hanoi",
    "Singapore", "Jakarta", "Manila", "Seoul", "Busan", "Beijing", "Shanghai", "Taipei", "Sydney",
    "Melbourne", "Auckland", "東京", "京都", "北京", "上海", "서울", "Москва", "Київ", "Αθήνα",
]
HELDOUT_PLACES = [
    "Akureyri", "Ljubljana", "Bratislava", "Tallinn", "Vilnius", "Riga", "Zagreb", "Sarajevo",
    "Valparaíso", "Cusco", "Asunción", "Montevideo", "Winnipeg", "Anchorage", "Honolulu",
    "Marrakech", "Kigali", "Addis Ababa", "Ulaanbaatar", "Kathmandu", "Tbilisi", "Yerevan",
    "大阪", "札幌", "廣州", "Новосибирск", "Łeba", "Årsta",
]

COUNTRIES_CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Spain", "Madrid"), ("Italy", "Rome"),
    ("Portugal", "Lisbon"), ("Austria", "Vienna"), ("Poland", "Warsaw"), ("Norway", "Oslo"),
    ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"),
    ("Ireland", "Dublin"), ("Japan", "Tokyo"), ("China", "Beijing"), ("India", "New Delhi"),
    ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Canada", "Ottawa"), ("Mexico", "Mexico City"),
    ("Brazil", "Brasília"), ("Argentina", "Buenos Aires"), ("Peru", "Lima"), ("Chile", "Santiago"),
    ("Greece", "Athens"), ("Turkey", "Ankara"), ("Russia", "Moscow"), ("Australia", "Canberra"),
    ("South Korea", "Seoul"), ("Thailand", "Bangkok"), ("Vietnam", "Hanoi"),
    ("the Netherlands", "Amsterdam"), ("Belgium", "Brussels"), ("Switzerland", "Bern"),
    ("Hungary", "Budapest"), ("Czechia", "Prague"), ("Iceland", "Reykjavík"),
    ("the United Kingdom", "London"), ("the United States", "Washington"),
]

JOBS = [
    "nurse", "teacher", "engineer", "doctor", "pilot", "chef", "baker", "farmer", "lawyer",
    "designer", "plumber", "writer", "painter", "driver", "scientist", "librarian", "dentist",
    "architect", "carpenter", "musician", "accountant", "mechanic", "pharmacist", "programmer",
]
COMPANIES = [
    "Acme Corp", "Globex", "Initech", "Umbrella Ltd", "Stark Works", "Blue Harbor Inc",
    "Northwind", "Contoso", "Fabrikam", "Tailspin Toys", "Wide World Importers", "Litware",
    "Nordlicht GmbH", "Soleil SA", "Sakura Systems", "Lotus Labs", "Maple Foods", "Kiwi Tech",
]
PRODUCTS = [
    "apple", "book", "lamp", "chair", "ticket", "shirt", "mug", "pen", "notebook", "bottle",
    "candle", "plant", "towel", "pillow", "battery", "cable", "ball", "hat", "bag", "clock",
]
COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white", "pink", "grey"]
WORDS = [
    "blue moon", "summer", "river song", "quiet night", "fast lane", "green tea", "hello world",
    "daily report", "project alpha", "big sale", "spring cleaning", "team lunch", "road trip",
    "birthday party", "weekly sync", "book club", "morning run", "jazz", "rock", "pop", "classical",
    "urgent", "low", "high", "medium", "draft", "final", "public", "private", "metric", "imperial",
    "celsius", "fahrenheit", "json", "csv", "pdf", "English", "French", "German", "Spanish",
    "Japanese", "café au lait", "crème brûlée", "naïve plan", "smörgåsbord", "piñata", "ramen",
    "寿司", "こんにちは", "你好", "안녕하세요", "Привет", "γεια σου",
]
